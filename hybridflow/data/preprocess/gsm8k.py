"""GSM8K -> verl-format parquet (Cobbe et al. 2021), matching verl's ``examples/data_preprocess/gsm8k.py``.

Each question gets verl's instruction appended so the policy learns to end with ``#### <answer>``, which the
strict GSM8K scorer requires; ``extra_info`` keeps the original question and worked answer.
"""

from __future__ import annotations

import argparse
import os

from hybridflow.data.io import write_parquet
from hybridflow.data.preprocess.common import load_hub_split, read_split, require_columns, run_main, standard_parser

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def extract_final_answer(answer: str) -> str:
    """The number after ``####`` in a reference solution, thousands separators removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' final-answer marker: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def to_row(example: dict, split: str, index: int) -> dict:
    question = example["question"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_final_answer(example["answer"])},
        "extra_info": {"split": split, "index": index, "answer": example["answer"], "question": question},
    }


def preprocess_gsm8k(input_dir: str | None, local_dir: str) -> dict[str, str]:
    """Write ``train.parquet`` / ``test.parquet`` under ``local_dir`` from ``input_dir`` jsonl or the hub."""
    paths = {}
    for split in ("train", "test"):
        rows = read_split(input_dir, split) if input_dir else load_hub_split("openai/gsm8k", split, "main")
        require_columns(rows, ("question", "answer"), f"GSM8K {split} split")
        out = [to_row(r, split, i) for i, r in enumerate(rows)]
        paths[split] = write_parquet(out, os.path.join(local_dir, f"{split}.parquet"))
    return paths


def setup_parser(parser: argparse.ArgumentParser) -> None:
    standard_parser(parser, "~/data/gsm8k")


def run(args: argparse.Namespace) -> dict[str, str]:
    return preprocess_gsm8k(args.input, os.path.expanduser(args.local_dir))


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data gsm8k", argv)
