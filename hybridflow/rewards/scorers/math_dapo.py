"""DAPO math scoring (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale").

DAPO-Math-17k asks for a final line ``Answer: <integer>``; the reward is +1 for a correct answer and -1
otherwise (no separate format reward), computed on the last 300 characters. The extracted answer is
normalised in the style of Minerva (Lewkowycz et al. 2022, appendix D): take the right-hand side of an
equation, drop units, ``\\text{}``, dollar signs, thousands separators and ``\\boxed``. Returns
``{"score", "acc", "pred"}`` so reward managers log accuracy next to the ±1 score.
"""

from __future__ import annotations

import re

from hybridflow.rewards.scorers.boxed import extract_boxed_answer

_TAIL_CHARS = 300
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_REMOVED = ["square units", "units", "unit", "degrees", "cm", "inches", "inch", "meters", "feet", "mph", "\\%", "%",
            "\\$", "$", "\\!", "\\,", "\\;", "\\ "]


def normalize_final_answer(answer: str) -> str:
    """Canonical string form of a final answer (Minerva normalisation, simplified)."""
    s = answer.strip().split("=")[-1].strip()
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = re.sub(r"\\textbf\{(.*?)\}", r"\1", s)
    boxed = extract_boxed_answer(s)
    if boxed is not None:
        s = boxed
    for token in _REMOVED:
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"(\d),(\d\d\d)", r"\1\2", s)
    s = s.replace(" ", "").rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False) -> dict:
    """+1.0 / -1.0 with ``acc`` and the normalised prediction ``pred``.

    ``strict_box_verify`` grades the last ``\\boxed{}`` instead of the ``Answer:`` line.
    """
    tail = solution_str[-_TAIL_CHARS:]
    if strict_box_verify:
        raw = extract_boxed_answer(tail)
    else:
        found = _ANSWER.findall(tail)
        raw = found[-1] if found else None
    pred = normalize_final_answer(raw) if raw is not None else "[INVALID]"
    correct = raw is not None and pred == normalize_final_answer(str(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
