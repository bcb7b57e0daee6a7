"""Built-in synthetic tasks with exact rule rewards, small enough for a char-level model to learn on a CPU.

They power the quickstart and the benchmarks: a 0.4-1M parameter char-level Qwen2 sees prompts of ~10-20
characters and answers in at most 8, so a full RL run takes minutes and the reward curve is unambiguous.

* ``addition``  -- ``"07+45="`` -> ``"52"`` (two 2-digit numbers, zero-padded so every prompt has one length)
* ``addition_fixed`` -- ``"07+45="`` -> ``"052"``: the same sums with every answer zero-padded to 3 digits, so
  answer length is never a confound (a wrong length is always a wrong answer); the quickstart's task
* ``reverse``   -- ``"reverse 0413:"`` -> ``"3140"``
* ``sort``      -- ``"sort 3142:"`` -> ``"1234"``
* ``multiplication`` -- ``"423*45"`` -> ``"19035"`` (3-digit x 2-digit with a 5-digit product): beyond what a tiny model computes in its
  head, exact with a calculator -- the task of ``hybridflow quickstart --task tool-use``; scored on the last
  line of the response (the final answer after any tool round)
* ``countdown`` -- ``"make 14 from 3 4 2:"`` -> any expression using 3, 4 and 2 once each that equals 14,
  e.g. ``"3*4+2"`` (a miniature of the TinyZero countdown task)

Rows are verl rows (``data_source = "synthetic/<task>"``) and are scored by ``hybridflow.rewards``'s built-in
scorers for those sources. Ground truths are strings in every task so the tasks can share one parquet file.
Train and test sets come from different seeds; with few distinct prompts (10,000 additions) they may overlap.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Callable

from hybridflow.data.io import write_parquet
from hybridflow.utils.registry import Registry

SYNTHETIC_TASKS: Registry["SyntheticTask"] = Registry("synthetic task")


@dataclass(frozen=True)
class SyntheticTask:
    """A generator of ``(prompt text, ground truth)`` pairs from a seeded ``random.Random``."""

    name: str
    ability: str
    example: Callable[[random.Random], tuple[str, str]]

    @property
    def data_source(self) -> str:
        return f"synthetic/{self.name}"

    def make_rows(self, n: int, seed: int, split: str) -> list[dict]:
        """``n`` verl rows; the same ``(seed, split)`` always gives the same rows."""
        if n <= 0:
            raise ValueError(f"number of synthetic rows must be positive, got {n}")
        rng = random.Random(f"{self.name}:{split}:{seed}")
        rows = []
        for i in range(n):
            prompt, answer = self.example(rng)
            rows.append({
                "data_source": self.data_source,
                "prompt": [{"role": "user", "content": prompt}],
                "ability": self.ability,
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i},
            })
        return rows


def _addition(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"{a:02d}+{b:02d}=", str(a + b)


def _addition_fixed(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return f"{a:02d}+{b:02d}=", f"{a + b:03d}"


def _digits(rng: random.Random, n: int = 4) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _reverse(rng: random.Random) -> tuple[str, str]:
    d = _digits(rng)
    return f"reverse {d}:", d[::-1]


def _sort(rng: random.Random) -> tuple[str, str]:
    d = _digits(rng)
    return f"sort {d}:", "".join(sorted(d))


def _multiplication(rng: random.Random) -> tuple[str, str]:
    while True:  # every answer has 5 digits: its length is never a cue
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if a * b >= 10_000:
            return f"{a}*{b}", str(a * b)


def countdown_ground_truth(target: int, numbers: list[int]) -> str:
    """String form ``"target:14;numbers:3,4,2"`` parsed by the ``synthetic/countdown`` scorer."""
    return f"target:{target};numbers:{','.join(str(n) for n in numbers)}"


_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


def _apply(a: int, op1: str, b: int, op2: str, c: int) -> int:
    """Value of ``a op1 b op2 c`` with the usual precedence (``*`` binds first)."""
    if op2 == "*" and op1 != "*":
        return _OPS[op1](a, b * c)
    return _OPS[op2](_OPS[op1](a, b), c)


def _countdown(rng: random.Random) -> tuple[str, str]:
    while True:
        nums = [rng.randint(1, 9) for _ in range(3)]
        a, b, c = rng.sample(nums, 3)
        op1, op2 = rng.choice("+-*"), rng.choice("+-*")
        target = _apply(a, op1, b, op2, c)
        if 0 <= target <= 99:
            return f"make {target} from {' '.join(map(str, nums))}:", countdown_ground_truth(target, nums)


for _task in (
    SyntheticTask("addition", "arithmetic", _addition),
    SyntheticTask("reverse", "string", _reverse),
    SyntheticTask("sort", "string", _sort),
    SyntheticTask("countdown", "arithmetic", _countdown),
    SyntheticTask("addition_fixed", "arithmetic", _addition_fixed),
    SyntheticTask("multiplication", "arithmetic", _multiplication),
):
    SYNTHETIC_TASKS.register(_task.name, _task)


def make_rows(task: str, n: int, seed: int, split: str) -> list[dict]:
    return SYNTHETIC_TASKS.get(task).make_rows(n, seed, split)


def write_synthetic(task: str, local_dir: str, train_size: int = 2000, test_size: int = 200, seed: int = 0) -> dict:
    """Write ``train.parquet`` and ``test.parquet`` of ``task`` into ``local_dir``; returns the paths."""
    spec = SYNTHETIC_TASKS.get(task)
    return {
        split: write_parquet(spec.make_rows(n, seed, split), os.path.join(local_dir, f"{split}.parquet"))
        for split, n in (("train", train_size), ("test", test_size))
    }
