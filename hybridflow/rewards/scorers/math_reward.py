"""MATH scoring: last ``\\boxed{}`` of the response, compared with the ground truth by math-verify.

Hendrycks et al. 2021 grade MATH by the boxed final answer; exact string match under-counts equivalent forms
(``0.5`` vs ``\\frac{1}{2}``, ``\\dfrac`` vs ``\\frac``), so equivalence is decided by HF ``math_verify``
(symbolic comparison with sympy). A cheap normalised string comparison runs first, so the common exact case
never pays for sympy. math-verify's own timeouts use SIGALRM, which only works in a main thread; the reward
pool runs scorers in worker-process main threads, and elsewhere we disable them (``timeout=None``) and rely
on the pool's per-sample timeout instead.
"""

from __future__ import annotations

import threading

from hybridflow.rewards.scorers.boxed import extract_boxed_answer


def _normalise(ans: str) -> str:
    s = ans.strip().strip("$").replace(" ", "").replace("\\!", "")
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", "")):
        s = s.replace(old, new)
    return s.rstrip(".")


def is_equiv(pred: str, ground_truth: str) -> bool:
    """True when ``pred`` and ``ground_truth`` (LaTeX answers without ``\\boxed``) denote the same value."""
    if _normalise(pred) == _normalise(ground_truth):
        return True
    from math_verify import parse, verify  # sympy import is ~1 s: only when needed

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${ground_truth}$", parsing_timeout=timeout)
    target = parse(f"${pred}$", parsing_timeout=timeout)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=timeout))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last boxed answer of ``solution_str`` is equivalent to ``ground_truth``, else 0.0."""
    pred = extract_boxed_answer(solution_str)
    if pred is None:
        return 0.0
    gt = extract_boxed_answer(ground_truth) or ground_truth
    return 1.0 if is_equiv(pred, gt) else 0.0
