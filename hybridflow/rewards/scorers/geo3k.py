"""Geometry3K (``hiyouga/geometry3k``) scoring as verl's geo3k scorer: boxed-answer accuracy + a format bonus.

score = (1 - format_score) x accuracy + format_score x format, with ``format_score = 0.1``:

* accuracy 1.0 when the content of the response's last ``\\boxed{}`` equals the ground truth (a normalised
  string match first, then symbolic equivalence through ``math_verify`` -- verl grades with mathruler's
  ``grade_answer``, a sympy comparison of the same kind);
* format 1.0 when the response is ``<think>...</think>`` followed by text holding a ``\\boxed{...}``
  (the instruction the geo3k preprocessor appends to every problem).
"""

from __future__ import annotations

import re

from hybridflow.rewards.scorers.boxed import extract_boxed_answer
from hybridflow.rewards.scorers.math_reward import is_equiv

DATA_SOURCE = "hiyouga/geometry3k"
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(response: str) -> float:
    return 1.0 if _FORMAT.fullmatch(response) else 0.0


def acc_reward(response: str, ground_truth: str, use_boxed: bool = True) -> float:
    answer = extract_boxed_answer(response) if use_boxed else response
    if answer is None or not str(ground_truth).strip():
        return 0.0
    return 1.0 if is_equiv(answer, str(ground_truth)) else 0.0


def compute_score(solution_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    return ((1.0 - format_score) * acc_reward(solution_str, ground_truth, use_boxed)
            + format_score * format_reward(solution_str))
