"""``hybridflow data vision --task shape_color``: write a built-in synthetic visual task as verl parquet."""

from __future__ import annotations

import argparse
import os

from hybridflow.data.preprocess.common import run_main, standard_parser
from hybridflow.data.vision_task import VISION_TASKS, write_vision_task


def setup_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="shape_color", choices=VISION_TASKS.names())
    standard_parser(parser, "~/data/vision", with_input=False)
    parser.add_argument("--train-size", type=int, default=1000)
    parser.add_argument("--test-size", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=32, help="side of the square images in pixels")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, str]:
    out = os.path.join(os.path.expanduser(args.local_dir), args.task)
    return write_vision_task(args.task, out, args.train_size, args.test_size, args.seed, args.image_size)


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data vision", argv)
