"""``hybridflow data synthetic --task addition``: write a built-in synthetic task as verl parquet."""

from __future__ import annotations

import argparse
import os

from hybridflow.data.preprocess.common import run_main, standard_parser
from hybridflow.data.synthetic import SYNTHETIC_TASKS, write_synthetic


def preprocess_synthetic(input_dir: str | None, local_dir: str, task: str = "addition", train_size: int = 2000,
                         test_size: int = 200, seed: int = 0) -> dict[str, str]:
    if input_dir is not None:
        raise ValueError("synthetic tasks are generated locally; do not pass --input")
    return write_synthetic(task, local_dir, train_size, test_size, seed)


def setup_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="addition", choices=SYNTHETIC_TASKS.names())
    standard_parser(parser, "~/data/synthetic", with_input=False)
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, str]:
    out = os.path.join(os.path.expanduser(args.local_dir), args.task)
    return preprocess_synthetic(None, out, args.task, args.train_size, args.test_size, args.seed)


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data synthetic", argv)
