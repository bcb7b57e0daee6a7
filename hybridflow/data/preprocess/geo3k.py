"""Geometry3K -> verl-format multimodal parquet, matching verl's ``examples/data_preprocess/geo3k.py``.

Input: a local copy of ``hiyouga/geometry3k`` (``--input DIR`` with ``train`` / ``test`` files in parquet, json
or jsonl; columns ``problem``, ``answer``, ``images``), or the hub name when the machine has network access.
Each row keeps its images (``{"bytes", "path"}`` dicts as ``datasets`` stores them, or paths / raw bytes) in the
``images`` column; the problem text carries the ``<image>`` markers where the figures go and gets verl's
instruction appended, so the policy answers ``<think>...</think> ... \\boxed{answer}``, which the geo3k scorer
(``rewards/scorers/geo3k.py``) grades.
"""

from __future__ import annotations

import argparse
import os

from hybridflow.data.io import DataFileError, read_hub_rows, write_parquet
from hybridflow.data.multimodal import IMAGE_PLACEHOLDER, as_media_list
from hybridflow.data.preprocess.common import HUB_FIX, read_split, require_columns, run_main, standard_parser

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = (
    r"You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    r"The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)


def to_row(example: dict, split: str, index: int) -> dict:
    problem = str(example["problem"])
    images = as_media_list(example["images"])
    marks = problem.count(IMAGE_PLACEHOLDER)
    if marks != len(images):
        raise DataFileError(f"Geometry3K {split} row {index}: the problem has {marks} {IMAGE_PLACEHOLDER} marker(s) "
                            f"but {len(images)} image(s); fix the source row (each figure needs one marker)")
    answer = str(example["answer"])
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
    }


def preprocess_geo3k(input_dir: str | None, local_dir: str) -> dict[str, str]:
    """Write ``train.parquet`` / ``test.parquet`` under ``local_dir`` from ``input_dir`` files or the hub."""
    paths = {}
    for split in ("train", "test"):
        rows = read_split(input_dir, split) if input_dir else read_hub_rows(DATA_SOURCE, split, fix=HUB_FIX)
        require_columns(rows, ("problem", "answer", "images"), f"Geometry3K {split} split")
        out = [to_row(r, split, i) for i, r in enumerate(rows)]
        paths[split] = write_parquet(out, os.path.join(local_dir, f"{split}.parquet"))
    return paths


def setup_parser(parser: argparse.ArgumentParser) -> None:
    standard_parser(parser, "~/data/geo3k")


def run(args: argparse.Namespace) -> dict[str, str]:
    return preprocess_geo3k(os.path.expanduser(args.input) if args.input else None, os.path.expanduser(args.local_dir))


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data geo3k", argv)
