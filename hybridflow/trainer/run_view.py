"""What a mode, a stage hook and the PPO step may read and change of the run: the controller as they see it.

The controller (``trainer/controller.py``) is the one implementation; modes, hooks, the step's stages and the
weight-sync policies are written against this protocol, so they sit below the controller and never import it.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from hybridflow.config.plan import StepPlan
from hybridflow.trainer.stages import WorkerGroups

__all__ = ["Run"]


class Run(Protocol):
    """The state of one run (see the module docstring)."""

    config: Any  # the run's PPOConfig
    tokenizer: Any
    groups: WorkerGroups
    plan: StepPlan
    hooks: Any  # trainer.hooks.Hooks
    weights: Any  # the mode's weight-sync policy (trainer/weight_sync.py)
    train_dataloader: Any
    reward_fn: Callable
    async_reward: Any  # AsyncRewardScorer or None
    kl_ctrl: Any
    validator: Any  # trainer.validation.Validator or None
    drift: Any  # trainer.drift.DriftMonitor, or None with trainer.drift.enable=false
    history: Any  # trainer.controller.RunHistory
    flops_counters: dict
    global_steps: int
    total_training_steps: int
    epoch: int
    skipped_steps: int
    tolerated_failures: float
    n_devices: int
    dp_size: int
