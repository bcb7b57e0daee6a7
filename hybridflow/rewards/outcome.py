"""Turning raw scorer outputs into rewards: validation, error policy and error accounting.

A scorer may return a number or a dict with a ``score`` key (verl convention; the other keys become
``reward_extra_info`` columns). Anything else -- an exception, a timeout, NaN/inf, a string, a dict without
``score`` -- is an *error*: it is scored ``error_score`` and counted, and the first traceback is logged once, so
one broken sample is visible in metrics without stopping training.  Each sample's error is also kept
(:attr:`ErrorTracker.sample_errors`: ``None`` or the reason; the full traceback for the first error of a call,
its last line for the others) so the trainer can stop a step where too many samples could not be scored and
say why (``hybridflow.trainer.step_failures``).

A finite score beyond ``+-REWARD_LIMIT`` (1e6) is clipped to it and counted in ``reward/clipped_count`` (the
first one is logged): larger values overflow float32 in the advantage computation (a reward of 1e300 used to
crash the run), and no useful reward scale needs them.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from hybridflow.rewards.pool import ERROR, OK, TIMEOUT, TaskResult

logger = logging.getLogger(__name__)
REWARD_LIMIT = 1e6


@dataclass
class ScoringConfig:
    """How scorers run: ``num_workers`` processes (0 = in-process), ``timeout_s`` per call, ``error_score``, and
    ``worker_memory_mb``: the resident memory a scoring process may reach (then it is replaced)."""

    num_workers: int = 1
    timeout_s: float = 30.0
    error_score: float = 0.0
    worker_memory_mb: float = 4096.0

    def __post_init__(self):
        if not self.worker_memory_mb >= 64:
            raise ValueError(f"reward_model.worker_memory_mb must be >= 64 MiB (a scoring process that grows past it "
                             f"is replaced), got {self.worker_memory_mb}")
        if self.num_workers < 0:
            raise ValueError(f"reward_model.num_workers must be >= 0 (0 scores in-process), got {self.num_workers}")
        if not self.timeout_s > 0:
            raise ValueError(f"reward_model.timeout_s must be > 0 seconds, got {self.timeout_s}")


def as_score(value: Any) -> tuple[float, dict[str, Any]]:
    """``(score, extra)`` from a scorer result; raises ``TypeError``/``ValueError`` when it is not usable."""
    extra: dict[str, Any] = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"reward function returned a dict without a 'score' key: keys {sorted(value)}")
        extra = dict(value)
        value = value["score"]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"reward function returned {type(value).__name__} {value!r}; expected a float or int")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"reward function returned a non-finite score {score}")
    return score, extra


@dataclass
class ErrorTracker:
    """Counts errors and timeouts for one manager; logs the first traceback of its lifetime."""

    error_score: float
    judge: bool = False  # a judge serves the scorers: its timeouts and unreadable answers are counted apart
    logged_first: bool = False
    first_error: str | None = None
    step_errors: int = 0
    step_timeouts: int = 0
    step_judge_timeouts: int = 0
    step_judge_unparsable: int = 0
    total_errors: int = 0
    total_timeouts: int = 0
    sample_errors: list = field(default_factory=list)  # this call, one entry per resolved sample: None or why
    step_clipped: int = 0
    logged_clip: bool = False

    def reset_step(self) -> None:
        self.step_errors = 0
        self.step_timeouts = 0
        self.step_judge_timeouts = 0
        self.step_judge_unparsable = 0
        self.sample_errors = []
        self.step_clipped = 0

    def resolve(self, result: TaskResult, where: str) -> tuple[float, dict[str, Any]]:
        """Score + extra for ``result``; errors become ``error_score`` and are counted."""
        if result.status == OK:
            try:
                score, extra = self._clip(*as_score(result.value), where)
            except (TypeError, ValueError) as exc:
                self._record(ERROR, f"{type(exc).__name__}: {exc}", where)
                return self.error_score, {}
            self.sample_errors.append(None)
            return score, extra
        self._record(result.status, result.error or result.status, where)
        return self.error_score, {}

    def _clip(self, score: float, extra: dict[str, Any], where: str) -> tuple[float, dict[str, Any]]:
        if abs(score) <= REWARD_LIMIT:
            return score, extra
        self.step_clipped += 1
        if not self.logged_clip:
            self.logged_clip = True
            logger.warning("reward function returned %g (%s); clipped to %g. Rewards beyond +-%g overflow the "
                           "advantage computation; rescale the reward. Further ones are counted in "
                           "reward/clipped_count.", score, where, math.copysign(REWARD_LIMIT, score), REWARD_LIMIT)
        return math.copysign(REWARD_LIMIT, score), extra

    def _record(self, status: str, detail: str, where: str) -> None:
        detail = detail.strip()
        first_of_call = not any(self.sample_errors)
        reason = "timed out: " if status == TIMEOUT else ""
        self.sample_errors.append(f"{where}: {reason}{detail if first_of_call else _last_line(detail)}")
        last = _last_line(detail)
        if "JudgeTimeout" in last:
            self.step_judge_timeouts += 1
        elif "JudgeParseError" in last:
            self.step_judge_unparsable += 1
        if status == TIMEOUT:
            self.step_timeouts += 1
            self.total_timeouts += 1
        else:
            self.step_errors += 1
            self.total_errors += 1
        if not self.logged_first:
            self.logged_first = True
            self.first_error = f"{where}: {detail}"
            logger.warning(
                "reward function %s (%s); scored error_score=%s. Further errors are only counted in "
                "reward/error_count and reward/timeout_count.\n%s",
                "timed out" if status == TIMEOUT else "failed", where, self.error_score, detail,
            )

    def metrics(self, num_scored: int) -> dict[str, float]:
        out = {
            "reward/error_count": float(self.step_errors),
            "reward/timeout_count": float(self.step_timeouts),
            "reward/error_rate": (self.step_errors + self.step_timeouts) / max(num_scored, 1),
            "reward/clipped_count": float(self.step_clipped),
        }
        if self.judge:
            out["reward/judge_timeout_count"] = float(self.step_judge_timeouts)
            out["reward/judge_unparsable_count"] = float(self.step_judge_unparsable)
        return out


def _last_line(text: str) -> str:
    """The line of a traceback that says what was raised (its last non-empty line)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else text
