"""Preprocessors writing verl-format ``train.parquet`` / ``test.parquet``.

``DATA_COMMANDS`` maps a ``hybridflow data <name>`` sub-command to ``(description, setup_parser, run)``:
``setup_parser(argparse.ArgumentParser)`` adds the options, ``run(argparse.Namespace) -> {split: path}``
does the work. Each module also has ``preprocess_<name>(input_dir_or_None, local_dir)`` and ``main(argv)``.
"""

from __future__ import annotations

from hybridflow.data.preprocess import countdown, geo3k, gsm8k, math_lighteval, synthetic, vision
from hybridflow.data.preprocess.countdown import preprocess_countdown
from hybridflow.data.preprocess.geo3k import preprocess_geo3k
from hybridflow.data.preprocess.gsm8k import preprocess_gsm8k
from hybridflow.data.preprocess.math_lighteval import preprocess_math
from hybridflow.data.preprocess.synthetic import preprocess_synthetic

DATA_COMMANDS = {
    "gsm8k": ("GSM8K grade-school math (local jsonl via --input, or openai/gsm8k); --tool: tool-agent rows",
              gsm8k.setup_parser, gsm8k.run),
    "math": ("MATH competition problems (local files via --input, or MATH-lighteval)", math_lighteval.setup_parser,
             math_lighteval.run),
    "countdown": ("Countdown equations, generated locally (seeded)", countdown.setup_parser, countdown.run),
    "synthetic": ("Built-in synthetic tasks (addition, reverse, sort, countdown) for tiny models",
                  synthetic.setup_parser, synthetic.run),
    "geo3k": ("Geometry3K diagrams + questions for VLMs (local copy via --input, or hiyouga/geometry3k)",
              geo3k.setup_parser, geo3k.run),
    "vision": ("Built-in synthetic visual tasks drawn with Pillow (shape_color, shape_count) for tiny VLMs",
               vision.setup_parser, vision.run),
}

__all__ = ["DATA_COMMANDS", "preprocess_countdown", "preprocess_geo3k", "preprocess_gsm8k", "preprocess_math", "preprocess_synthetic"]
