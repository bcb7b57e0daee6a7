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


def final_line_match(solution_str: str, ground_truth: str) -> float:
    """1.0 when the last line of the response equals the ground truth (whitespace around it ignored).

    For multi-turn responses (a tool call, its result, then the answer) the last line is the model's final
    answer: a tool-agent trajectory always ends with a model turn, so a tool's output is never the last line.
    A single-line response is scored exactly like :func:`exact_match`.
    """
    lines = solution_str.rstrip().split("\n")
    return 1.0 if lines[-1].strip() == str(ground_truth).strip() else 0.0


def parse_countdown_ground_truth(ground_truth: str) -> tuple[int, list[int]]:
    """``"target:14;numbers:3,4,2"`` -> ``(14, [3, 4, 2])``."""
    try:
        fields = dict(part.split(":", 1) for part in str(ground_truth).split(";"))
        return int(fields["target"]), [int(n) for n in fields["numbers"].split(",")]
    except (KeyError, ValueError):
        raise ValueError(
            f"synthetic/countdown ground_truth must look like 'target:14;numbers:3,4,2', got {ground_truth!r}"
        ) from None


def countdown_lite(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response is an expression using each given number once that equals the target."""
    target, numbers = parse_countdown_ground_truth(ground_truth)
    return 1.0 if check_equation(solution_str.strip(), target, numbers) else 0.0


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """verl-signature entry for every ``synthetic/*`` source, usable as ``custom_reward_function.path``.

    ``countdown`` checks the expression, ``multiplication`` the last line (:func:`final_line_match`); every other synthetic task (including ``addition_fixed``, whose
    zero-padded answers must match digit for digit) is scored by :func:`exact_match`.
    """
    if not str(data_source).startswith("synthetic/"):
        raise ValueError(f"synthetic compute_score got data_source={data_source!r}; it only scores 'synthetic/<task>' rows")
    if data_source == "synthetic/countdown":
        return countdown_lite(solution_str, ground_truth)
    if data_source == "synthetic/multiplication":
        return final_line_match(solution_str, ground_truth)
    return exact_match(solution_str, ground_truth)
