"""Preprocessors writing verl-format ``train.parquet`` / ``test.parquet``.

``DATA_COMMANDS`` maps a ``hybridflow data <name>`` sub-command to ``(description, setup_parser, run)``:
``setup_parser(argparse.ArgumentParser)`` adds the options, ``run(argparse.Namespace) -> {split: path}``
does the work. Each module also has ``preprocess_<name>(input_dir_or_None, local_dir)`` and ``main(argv)``.
"""

from __future__ import annotations

from hybridflow.data.preprocess import countdown, gsm8k, math_lighteval, synthetic
from hybridflow.data.preprocess.countdown import preprocess_countdown
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
}

__all__ = ["DATA_COMMANDS", "preprocess_countdown", "preprocess_gsm8k", "preprocess_math", "preprocess_synthetic"]
