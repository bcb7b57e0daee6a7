"""MATH (Hendrycks et al. 2021, the ``DigitalLearningGmbH/MATH-lighteval`` copy) -> verl-format parquet.

The ground truth is the content of the last ``\\boxed{}`` of the reference solution; the prompt asks for the
final answer in ``\\boxed{}``, which the MATH scorer extracts and compares with math-verify. Preprocessors are
command-line tools that sit above the package layers, so reusing the scorer's own ``\\boxed`` extraction here
is deliberate: ground truths are cut exactly the way responses are.
"""

from __future__ import annotations

import argparse
import os

from hybridflow.data.io import read_hub_rows, write_parquet
from hybridflow.data.preprocess.common import HUB_FIX, read_split, require_columns, run_main, standard_parser
from hybridflow.rewards.scorers.boxed import extract_boxed_answer

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def to_row(example: dict, split: str, index: int) -> dict:
    answer = extract_boxed_answer(example["solution"])
    if answer is None:
        raise ValueError(f"MATH {split} row {index}: solution has no \\boxed{{}} answer: {example['solution'][-80:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{example['problem']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "level": example.get("level"), "type": example.get("type")},
    }


def preprocess_math(input_dir: str | None, local_dir: str) -> dict[str, str]:
    """Write ``train.parquet`` / ``test.parquet`` from ``input_dir`` (jsonl/json/parquet) or the hub."""
    paths = {}
    for split in ("train", "test"):
        rows = read_split(input_dir, split) if input_dir else read_hub_rows(DATA_SOURCE, split, "default", HUB_FIX)
        require_columns(rows, ("problem", "solution"), f"MATH {split} split")
        out = [to_row(r, split, i) for i, r in enumerate(rows)]
        paths[split] = write_parquet(out, os.path.join(local_dir, f"{split}.parquet"))
    return paths


def setup_parser(parser: argparse.ArgumentParser) -> None:
    standard_parser(parser, "~/data/math")


def run(args: argparse.Namespace) -> dict[str, str]:
    return preprocess_math(args.input, os.path.expanduser(args.local_dir))


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data math", argv)
