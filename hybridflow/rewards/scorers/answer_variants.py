"""Strict and lenient accuracy of the math scorers side by side, each named after its answer extractor.

A math reward depends on *where* the answer is read from: GSM8K's ``#### <n>`` marker or the last number, MATH's
last ``\\boxed{}`` compared as a string or by symbolic equivalence, DAPO's ``Answer:`` line or a box. Training
uses the scorer the data source names (unchanged, verl's); validation reports both readings for every math row,
so a policy that learns the format (strict rises with lenient) is told apart from one that only finds the number
(lenient rises, strict stays):

==================  ======================================  ==========================================
data source         strict                                  lenient
==================  ======================================  ==========================================
openai/gsm8k        ``acc_strict_hash_marker``              ``acc_lenient_last_number``
MATH sources        ``acc_strict_boxed_string``             ``acc_lenient_boxed_math_verify``
math_dapo, aime*    ``acc_strict_answer_line``              ``acc_lenient_answer_line_or_boxed``
==================  ======================================  ==========================================

Each is 0/1 per response; the validation metrics turn them into ``val-aux/<source>/<name>/mean@N``, ``best@n``
and ``pass@k``.
"""

from __future__ import annotations

from typing import Any, Callable

from hybridflow.rewards.scorers import gsm8k, math_dapo, math_reward
from hybridflow.rewards.scorers.boxed import extract_boxed_answer

__all__ = ["answer_variants", "variant_names"]

_TAIL = 300


def _gsm8k(method: str) -> Callable[[str, Any], float]:
    return lambda response, truth: float(gsm8k.compute_score(response, str(truth), method=method) == 1.0)


def _boxed_string(response: str, truth: Any) -> float:
    pred = extract_boxed_answer(response)
    gt = extract_boxed_answer(str(truth)) or str(truth)
    return float(pred is not None and math_reward._normalise(pred) == math_reward._normalise(gt))


def _answer_line_or_boxed(response: str, truth: Any) -> float:
    if math_dapo.compute_score(response, str(truth))["acc"]:
        return 1.0
    boxed = extract_boxed_answer(response[-_TAIL:])
    return float(boxed is not None and
                 math_dapo.normalize_final_answer(boxed) == math_dapo.normalize_final_answer(str(truth)))


_GSM8K = {"acc_strict_hash_marker": _gsm8k("strict"), "acc_lenient_last_number": _gsm8k("flexible")}
_MATH = {"acc_strict_boxed_string": _boxed_string,
         "acc_lenient_boxed_math_verify": lambda r, t: float(math_reward.compute_score(r, str(t)))}
_DAPO = {"acc_strict_answer_line": lambda r, t: float(math_dapo.compute_score(r, str(t))["acc"]),
         "acc_lenient_answer_line_or_boxed": _answer_line_or_boxed}
_SOURCES: dict[str, dict[str, Callable[[str, Any], float]]] = {
    "openai/gsm8k": _GSM8K,
    **{s: _MATH for s in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")},
    **{s: _DAPO for s in ("math_dapo", "math", "math_dapo_reasoning")},
}


def _checks(data_source: str) -> dict[str, Callable[[str, Any], float]]:
    source = str(data_source)
    return _SOURCES.get(source) or (_DAPO if source.startswith("aime") else {})


def variant_names(data_source: str) -> list[str]:
    """The strict and lenient accuracy names of ``data_source`` ([] for a non-math source)."""
    return list(_checks(data_source))


def answer_variants(data_source: str, response: str, ground_truth: Any) -> dict[str, float]:
    """``{name: 0/1}`` for each reading of ``response`` against ``ground_truth`` ({} for a non-math source or
    a row without a ground truth)."""
    if ground_truth is None:
        return {}
    return {name: check(response, ground_truth) for name, check in _checks(data_source).items()}
