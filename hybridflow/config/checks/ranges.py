"""Numbers that parse but mean nothing, refused at config time: one table, one check (issue 24).

``actor.clip_ratio=-0.2``, ``ppo_epochs=0``, ``error_score=nan``, ``data.max_response_length=0`` and the like
used to be accepted and fail later (or silently train on nonsense); each entry names the key, the test, and what
the value must be.
"""

from __future__ import annotations

import math

from hybridflow.config.checks.values import _get

__all__ = ["VALUE_RANGES", "check_value_ranges"]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


_A = "actor_rollout_ref"
VALUE_RANGES: tuple[tuple[str, object, str], ...] = (
    ("data.max_prompt_length", lambda v: _finite(v) and v >= 1, "at least 1 token"),
    ("data.max_response_length", lambda v: _finite(v) and v >= 1,
     "at least 1 token: the rollout generates up to this many tokens per response"),
    (f"{_A}.actor.ppo_epochs", lambda v: _finite(v) and v >= 1, "at least 1 pass over each batch"),
    ("critic.ppo_epochs", lambda v: _finite(v) and v >= 1, "at least 1 pass over each batch"),
    (f"{_A}.actor.clip_ratio", lambda v: _finite(v) and v >= 0, "a non-negative number (PPO clips the ratio to "
                                                                 "[1 - clip_ratio, 1 + clip_ratio]; verl uses 0.2)"),
    (f"{_A}.actor.clip_ratio_low", lambda v: v is None or (_finite(v) and v >= 0), "a non-negative number"),
    (f"{_A}.actor.clip_ratio_high", lambda v: v is None or (_finite(v) and v >= 0), "a non-negative number"),
    (f"{_A}.actor.clip_ratio_c", lambda v: _finite(v) and v > 1, "greater than 1 (dual-clip bound; verl uses 3)"),
    (f"{_A}.actor.entropy_coeff", _finite, "a finite number"),
    (f"{_A}.actor.kl_loss_coef", lambda v: _finite(v) and v >= 0, "a non-negative number"),
    (f"{_A}.actor.optim.lr", lambda v: _finite(v) and v >= 0, "a non-negative learning rate"),
    ("critic.optim.lr", lambda v: _finite(v) and v >= 0, "a non-negative learning rate"),
    ("critic.cliprange_value", lambda v: _finite(v) and v >= 0, "a non-negative number"),
    (f"{_A}.rollout.n", lambda v: _finite(v) and v >= 1, "at least 1 response per prompt"),
    (f"{_A}.rollout.top_p", lambda v: _finite(v) and 0 < v <= 1, "in (0, 1]"),
    (f"{_A}.rollout.temperature", _finite, "a finite number"),
    ("algorithm.gamma", lambda v: _finite(v) and 0 <= v <= 1, "in [0, 1] (discount factor)"),
    ("algorithm.lam", lambda v: _finite(v) and 0 <= v <= 1, "in [0, 1] (GAE lambda)"),
    ("reward_model.error_score", _finite, "a finite number: it is the reward of every sample whose scoring failed"),
    ("reward_model.worker_memory_mb", lambda v: _finite(v) and v >= 64,
     "at least 64 MiB: a scoring process whose resident memory passes it is replaced"),
    ("data.max_row_bytes", lambda v: _finite(v) and v >= 1, "at least 1 byte: larger data rows are refused when read"),
    ("trainer.tolerated_failure_fraction", lambda v: _finite(v) and 0 <= v <= 1,
     "between 0 (stop at the first failed trajectory, reward or tool call of a step) and 1 (stop only when all of a "
     "step's failed)"),
    (f"{_A}.model.fused_kernel_options.chunk_size", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
     "an integer >= 0: rows per chunk of the fused LM head (0: as many as keep 128 MB of logits)"),
    (f"{_A}.rollout.stall_timeout_s", lambda v: _finite(v) and v >= 0,
     ">= 0: seconds without generation progress before a replica's requests fail (0 turns the watchdog off)"),
)


def check_value_ranges(cfg, errors: list[str]) -> None:
    """Refuse numbers outside their meaningful range (e.g. ``actor.clip_ratio=-0.2``, ``ppo_epochs=0``,
    ``error_score=nan``, ``data.max_response_length=0``) at config time, before anything starts."""
    for key, ok, requirement in VALUE_RANGES:
        try:
            value = _get(cfg, key)
        except AttributeError:
            continue
        try:
            good = bool(ok(value))
        except TypeError:
            good = False
        if not good:
            errors.append(f"{key}={value!r} is out of range: it must be {requirement}")
