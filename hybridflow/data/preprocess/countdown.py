"""Countdown (TinyZero, Pan et al. 2025), generated locally: reach ``target`` from ``nums`` with + - * /.

TinyZero draws its problems from a hub dataset; we generate them with a seeded RNG so no download is needed:
3-4 numbers in 1..99 and a target in 1..999 obtained by combining all the numbers with random operators, so
every problem is solvable. Rows carry TinyZero's ``target`` / ``nums`` columns, and the reward model ground
truth ``{"target", "numbers"}`` scored by ``data_source="countdown"``.
"""

from __future__ import annotations

import argparse
import os
import random
from fractions import Fraction

from hybridflow.data.io import write_parquet
from hybridflow.data.preprocess.common import run_main, standard_parser

DATA_SOURCE = "countdown"
_OPS = ("+", "-", "*", "/")


def _combine(x: Fraction, y: Fraction, op: str) -> Fraction | None:
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return x / y if y != 0 else None


def make_problem(rng: random.Random) -> tuple[int, list[int]]:
    """A solvable ``(target, nums)``: fold the shuffled numbers left to right with random operators."""
    while True:
        nums = [rng.randint(1, 99) for _ in range(rng.choice((3, 4)))]
        order = rng.sample(nums, len(nums))
        value: Fraction | None = Fraction(order[0])
        for n in order[1:]:
            value = _combine(value, Fraction(n), rng.choice(_OPS)) if value is not None else None
        if value is not None and value.denominator == 1 and 1 <= value <= 999:
            return int(value), nums


def prompt_text(target: int, nums: list[int]) -> str:
    return (
        f"Using the numbers {nums}, create an equation that equals {target}. You may use +, -, * and / and "
        "must use each number exactly once. Think in <think> </think> tags, then give only the equation in "
        "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )


def make_rows(n: int, seed: int, split: str) -> list[dict]:
    rng = random.Random(f"countdown:{split}:{seed}")
    rows = []
    for i in range(n):
        target, nums = make_problem(rng)
        rows.append({
            "data_source": DATA_SOURCE,
            "target": target,
            "nums": nums,
            "prompt": [{"role": "user", "content": prompt_text(target, nums)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": {"target": target, "numbers": nums}},
            "extra_info": {"split": split, "index": i},
        })
    return rows


def preprocess_countdown(input_dir: str | None, local_dir: str, train_size: int = 20000, test_size: int = 1000,
                         seed: int = 0) -> dict[str, str]:
    """Write generated ``train.parquet`` / ``test.parquet``; ``input_dir`` must be None (nothing to read)."""
    if input_dir is not None:
        raise ValueError("countdown problems are generated locally; do not pass --input")
    return {
        split: write_parquet(make_rows(n, seed, split), os.path.join(local_dir, f"{split}.parquet"))
        for split, n in (("train", train_size), ("test", test_size))
    }


def setup_parser(parser: argparse.ArgumentParser) -> None:
    standard_parser(parser, "~/data/countdown", with_input=False)
    parser.add_argument("--train-size", type=int, default=20000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, str]:
    return preprocess_countdown(None, os.path.expanduser(args.local_dir), args.train_size, args.test_size, args.seed)


def main(argv: list[str] | None = None) -> dict[str, str]:
    return run_main(setup_parser, run, "hybridflow data countdown", argv)
