"""Countdown scoring (the TinyZero task, Pan et al. 2025): build ``target`` from ``numbers`` with + - * /.

The response must put its equation in the last ``<answer>...</answer>``; each given number must be used
exactly once. Correct → ``score`` (1.0); well-formed but wrong → ``format_score`` (0.1, rewarding the format
as TinyZero does); no answer tag → 0.0.
"""

from __future__ import annotations

import re
from collections import Counter

from hybridflow.rewards.scorers.arith import ExpressionError, evaluate, literals

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_equation(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def check_equation(equation: str, target: int, numbers: list[int]) -> bool:
    """True when ``equation`` uses each of ``numbers`` exactly once and evaluates to ``target``."""
    try:
        used = literals(equation)
        value = evaluate(equation)
    except (ExpressionError, SyntaxError):
        return False
    return Counter(used) == Counter(int(n) for n in numbers) and value == target


def compute_score(solution_str: str, ground_truth: dict, format_score: float = 0.1, score: float = 1.0) -> float:
    if not isinstance(ground_truth, dict) or "target" not in ground_truth:
        raise ValueError(
            f"countdown ground_truth must be a dict with 'target' and 'numbers' (or 'nums'), got {ground_truth!r}"
        )
    numbers = ground_truth.get("numbers", ground_truth.get("nums"))
    if numbers is None:
        raise ValueError("countdown ground_truth lacks 'numbers' (or 'nums')")
    equation = extract_equation(solution_str)
    if equation is None:
        return 0.0
    return score if check_equation(equation, int(ground_truth["target"]), list(numbers)) else format_score
