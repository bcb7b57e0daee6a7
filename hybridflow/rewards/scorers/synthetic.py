"""Exact-match rewards for the built-in synthetic tasks (``hybridflow.data.synthetic``).

The tasks are chosen so a sub-1M-parameter char-level model can learn them in minutes on a CPU; the reward is
therefore strict and binary (1.0 only for exactly the right answer, surrounding whitespace ignored) so the
learning curve is easy to read. ``countdown`` expects an expression over the given digits instead.
"""

from __future__ import annotations

from hybridflow.rewards.scorers.countdown import check_equation


def exact_match(solution_str: str, ground_truth: str) -> float:
    """1.0 when the stripped response equals the ground truth string."""
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0


def countdown_lite(solution_str: str, ground_truth: dict) -> float:
    """1.0 when the response is an expression using each given number once that equals the target."""
    return 1.0 if check_equation(solution_str.strip(), int(ground_truth["target"]), list(ground_truth["numbers"])) else 0.0
