"""verl 0.9's V1 trainer keys: ``trainer.use_v1`` and ``trainer.v1.*`` -- read and described here (the
rules live in :mod:`hybridflow.config.checks.v1`, one step of the configuration check pipeline).

verl 0.9 runs every PPO job through one "V1" entry point whose ``trainer.v1.trainer_mode`` picks the controller:

* ``sync`` -- generate a batch, train on it (today's synchronous HybridFlow step, unchanged); the replay buffer
  applies its synchronous rules: failed groups are kept (or, with ``sampler.sync_refill_failed_groups``, evicted
  and refilled), DAPO-filtered groups are evicted and refilled;
* ``colocate_async`` -- rollout and training share the devices (the hybrid engine); ``num_warmup_batches``
  extra batches are in flight, a step trains on the first groups that finish, generation is interrupted for the
  update and resumed on the new weights (partial rollout);
* ``separate_async`` -- standalone rollout replicas generate without pause; the trainer takes one PPO
  mini-batch at a time (``data.train_batch_size = parameter_sync_step x ppo_mini_batch_size``) and pushes the
  weights after ``parameter_sync_step`` of them (hybridflow's fully async controller with verl's V1 sampler).

The sampler (``trainer.v1.sampler``) bounds staleness in steps (weight versions): a group submitted at step s and
sampled at step t has age ``t - s + 1``; ``max_off_policy_strategy=drop`` evicts (and refills) finished groups
whose age passed ``max_off_policy_threshold``, ``wait`` blocks sampling until in-flight groups that reached it
have finished.  Every key here acts in the mode that reads it or is refused at start-up with the reason.

verl defaults ``trainer.use_v1`` to true; here the default is false, which selects the same synchronous
trainer (``use_v1=true`` with ``trainer_mode=sync`` trains bit for bit what ``use_v1=false`` trains, tested), so
verl command lines behave alike either way.  This module is the one place that knows the node's shape.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

__all__ = ["V1_MODES", "V1_DEFAULTS", "V1_STRATEGIES", "V1Settings", "SamplerSettings", "v1_settings", "v1_mode",
           "v1_node", "flatten_node", "MODE_OF_KEY", "generates_beside_training", "describe_v1"]

V1_MODES = ("sync", "colocate_async", "separate_async")
V1_STRATEGIES = ("drop", "wait")

# verl 0.9's trainer.v1 node, with its defaults (hybrid_rollout as verl 0.9.1 adds it)
V1_DEFAULTS: dict[str, Any] = {
    "trainer_mode": "sync",
    "sync": {},
    "colocate_async": {"num_warmup_batches": 1},
    "separate_async": {
        "num_warmup_batches": 1,
        "parameter_sync_step": 4,
        "hybrid_rollout": {
            "enable_switch": False,
            "switch_threshold_ratio": 0.4,
            "adaptive_switch_threshold": True,
            "switch_threshold_step_up": 0.05,
            "switch_threshold_step_down": 0.03,
            "switch_threshold_release_steps": 2,
            "switch_cost_window_size": 3,
        },
    },
    "sampler": {
        "max_off_policy_threshold": 8,
        "max_off_policy_strategy": "drop",
        "sync_refill_failed_groups": False,
        "custom_sampler": {"path": None, "name": None},
        "sampler_kwargs": {},
    },
}

# where each key acts (a key not listed: every mode, or the mode named by its first part)
MODE_OF_KEY = {
    "colocate_async.num_warmup_batches": ("colocate_async",),
    "separate_async.num_warmup_batches": ("separate_async",),
    "separate_async.parameter_sync_step": ("separate_async",),
    "sampler.max_off_policy_threshold": ("colocate_async", "separate_async"),
    "sampler.max_off_policy_strategy": ("colocate_async", "separate_async"),
    "sampler.sync_refill_failed_groups": ("sync",),
}


@dataclass(frozen=True)
class SamplerSettings:
    max_off_policy_threshold: int
    max_off_policy_strategy: str
    sync_refill_failed_groups: bool
    custom_sampler_path: str | None
    custom_sampler_name: str | None
    sampler_kwargs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class V1Settings:
    """The V1 node of a run that set ``trainer.use_v1=true``."""

    mode: str
    num_warmup_batches: int  # of the chosen mode (0 for sync)
    parameter_sync_step: int  # separate_async: PPO mini-batches per weight sync (1 otherwise)
    sampler: SamplerSettings

    @property
    def is_async(self) -> bool:
        return self.mode != "sync"


def flatten_node(node: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(node, dict) and node:
        for key, value in node.items():
            out.update(flatten_node(value, f"{prefix}.{key}" if prefix else str(key)))
    else:
        out[prefix] = node
    return out


def v1_node(cfg) -> dict[str, Any]:
    """The trainer.v1 dict with every default filled in (a command line may set only some keys)."""
    merged = copy.deepcopy(V1_DEFAULTS)

    def merge(into: dict, extra: dict) -> None:
        for key, value in (extra or {}).items():
            if isinstance(value, dict) and isinstance(into.get(key), dict) and into.get(key):
                merge(into[key], value)
            else:
                into[key] = value

    merge(merged, dict(getattr(cfg.trainer, "v1", None) or {}))
    return merged


def v1_mode(cfg) -> str | None:
    """``trainer.v1.trainer_mode`` of a run with ``trainer.use_v1=true``; ``None`` without V1."""
    if not bool(getattr(cfg.trainer, "use_v1", False)):
        return None
    return str(v1_node(cfg)["trainer_mode"])


def v1_settings(cfg) -> V1Settings | None:
    """The typed V1 node (``None`` when ``trainer.use_v1=false``); values are checked by :mod:`hybridflow.config.checks.v1`."""
    mode = v1_mode(cfg)
    if mode is None:
        return None
    node = v1_node(cfg)
    s = node["sampler"]
    custom = s.get("custom_sampler") or {}
    mode_node = node.get(mode) or {}
    return V1Settings(
        mode=mode,
        num_warmup_batches=int(mode_node.get("num_warmup_batches", 0) or 0),
        parameter_sync_step=int(mode_node.get("parameter_sync_step", 1) or 1),
        sampler=SamplerSettings(
            max_off_policy_threshold=int(s["max_off_policy_threshold"]),
            max_off_policy_strategy=str(s["max_off_policy_strategy"]),
            sync_refill_failed_groups=bool(s["sync_refill_failed_groups"]),
            custom_sampler_path=custom.get("path"), custom_sampler_name=custom.get("name"),
            sampler_kwargs=dict(s.get("sampler_kwargs") or {}),
        ),
    )


def generates_beside_training(cfg) -> bool:
    """Do the rollout replicas keep generating while the trainer trains (async training, either kind)?"""
    mode = v1_mode(cfg)
    if mode is not None:
        return mode == "separate_async"
    return cfg.async_training.mode != "sync"


def describe_v1(cfg) -> list[str]:
    """Lines for ``--dry-run``: what the V1 mode does with the user's numbers."""
    v1 = v1_settings(cfg)
    if v1 is None:
        return []
    tb = int(cfg.data.train_batch_size)
    s = v1.sampler
    if v1.mode == "sync":
        rule = "failed groups evicted and refilled" if s.sync_refill_failed_groups else "failed groups kept"
        return [f"V1 sync: each step generates {tb} prompt groups and trains on them ({rule})"]
    lines = []
    if v1.mode == "colocate_async":
        lines.append(f"V1 colocate_async: {tb} + {v1.num_warmup_batches} x {tb} prompt groups in flight; a step trains "
                     f"on the first {tb} to finish, then generation is interrupted for the update and resumed on the "
                     "new weights")
    else:
        mini = tb // max(1, v1.parameter_sync_step)
        lines.append(f"V1 separate_async: the replicas generate continuously ({v1.num_warmup_batches} warm-up "
                     f"batch(es) ahead); a step trains {v1.parameter_sync_step} mini-batch(es) of {mini} prompt groups "
                     "as they become available, then pushes the weights")
    verb = "evicted and refilled" if s.max_off_policy_strategy == "drop" else "waited for"
    lines.append(f"V1 sampler: groups older than max_off_policy_threshold={s.max_off_policy_threshold} step(s) are "
                 f"{verb} ({s.max_off_policy_strategy})")
    return lines
