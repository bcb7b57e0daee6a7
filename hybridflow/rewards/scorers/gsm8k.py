"""GSM8K answer extraction and scoring (Cobbe et al. 2021, "Training Verifiers to Solve Math Word Problems").

The reference solutions end with ``#### <number>``; verl's scorer checks the model's final answer the same way.
``strict`` requires that marker (what the preprocessing instruction asks the policy to produce, so the format
itself is learned); ``flexible`` takes the last number anywhere in the response (useful for evaluating base
models that do not follow the instruction). Only the last 300 characters are searched, as verl does, so a long
chain of thought cannot smuggle in a correct number early and a wrong one at the end.
"""

from __future__ import annotations

import re

_TAIL_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def _clean(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Final numeric answer of ``solution_str`` or None when absent."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return _clean(found[-1]) if found else None
    for candidate in reversed(_NUMBER.findall(tail)):
        if candidate.strip(".,") != "":
            return _clean(candidate)
    return None


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` when the extracted answer equals the ground truth, ``format_score`` when wrong, 0 when absent."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == _clean(str(ground_truth)) else format_score
