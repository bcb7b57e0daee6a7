"""``trainer.drift.*``: the drift detector's levels and action (docs/drift.md)."""

from __future__ import annotations

import math

__all__ = ["check_drift"]

_KEY = "trainer.drift"
ACTIONS = ("stop", "warn")


def _level_error(name: str, value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return (f"{_KEY}.{name}={value!r}: give a probability gap in [0, 1) (mean |p_rollout - p_trainer| per token), "
                "or null for the level measured for the run's engine and dtype (docs/drift.md)")
    if value >= 1:
        return (f"{_KEY}.{name}={value!r} can never be reached (a probability gap is below 1): give a level in "
                "[0, 1), or trainer.drift.action=warn / trainer.drift.enable=false to never stop")
    return None


def check_drift(cfg, errors: list[str]) -> None:
    """Levels are probability gaps, ``stop`` is not below ``warn``, the action is known."""
    drift = cfg.trainer.drift
    if drift.action not in ACTIONS:
        errors.append(f"{_KEY}.action={drift.action!r}: choose one of {', '.join(ACTIONS)} (stop: a step above "
                      "trainer.drift.stop ends the run with the diagnosis; warn: it is flagged and named only)")
    bad = [e for e in (_level_error("warn", drift.warn), _level_error("stop", drift.stop)) if e]
    errors.extend(bad)
    if not bad and drift.warn is not None and drift.stop is not None and drift.stop < drift.warn:
        errors.append(f"{_KEY}.stop={drift.stop} is below {_KEY}.warn={drift.warn}: a step that stops the run must "
                      "also warn; give stop >= warn")
