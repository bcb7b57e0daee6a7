"""Stage hooks: what a recipe or an extra role adds to the PPO step, without a subclass of the controller.

A hook implements any of the points below (the rest keep PPO's behaviour); the controller runs every hook of
the run at each point, in the order of :func:`hooks_for`:

* ``after_scoring(run, batch, log) -> batch`` -- right after the reward (PRIME: accuracy labels and filter);
* ``after_log_probs(run, batch, log)`` -- after the old-log-prob and reference passes (distillation: the
  teachers score the samples);
* ``before_advantage(run, batch, log)`` -- PRIME: its implicit PRM trains and scores;
* ``advantage_estimator`` -- replaces ``algorithm.adv_estimator`` (PRIME's two-source RLOO);
* ``train(run, batch, log) -> batch | None`` -- a different update than PPO's (SPIN's DPO on pairs);
* ``trained_roles(groups)`` -- worker groups besides actor and critic that checkpoints hold (PRIME's PRM);
* ``before_step_metrics(batch, log)`` / ``after_step_metrics(metrics)`` -- adjust the step's verl metrics.

The judge of RLAIF runs are not a hook of the step: they sit behind the reward function
(``trainer/judge_service.JudgedRewardFn``), which wakes a colocated judge for the reward stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridflow.protocol import DataProto

if TYPE_CHECKING:
    from hybridflow.trainer.step_log import StepLog

__all__ = ["Hooks", "StageHook", "hooks_for"]


class StageHook:
    """Every hook point, doing nothing (PPO's step unchanged); a hook overrides the points it uses."""

    name = "ppo"
    advantage_estimator: str | None = None

    def after_scoring(self, run: Any, batch: DataProto, log: StepLog) -> DataProto:
        return batch

    def after_log_probs(self, run: Any, batch: DataProto, log: StepLog) -> None:
        return None

    def before_advantage(self, run: Any, batch: DataProto, log: StepLog) -> None:
        return None

    def train(self, run: Any, batch: DataProto, log: StepLog) -> DataProto | None:
        return None

    def trained_roles(self, groups: Any) -> dict[str, Any]:
        return {}

    def before_step_metrics(self, batch: DataProto, log: StepLog) -> None:
        return None

    def after_step_metrics(self, metrics: dict[str, float]) -> None:
        return None


class Hooks:
    """The run's hooks, called in order at each point (see the module docstring)."""

    def __init__(self, hooks: list[StageHook]):
        self.hooks = list(hooks)
        estimators = [h.advantage_estimator for h in self.hooks if h.advantage_estimator is not None]
        if len(estimators) > 1:
            raise ValueError(f"two stage hooks replace the advantage estimator: {estimators}")
        self.advantage_estimator = estimators[0] if estimators else None
        if sum(type(h).train is not StageHook.train for h in self.hooks) > 1:
            raise ValueError("two stage hooks replace the PPO update: " + ", ".join(h.name for h in self.hooks))

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hooks]

    def after_scoring(self, run: Any, batch: DataProto, log: StepLog) -> DataProto:
        for hook in self.hooks:
            batch = hook.after_scoring(run, batch, log)
        return batch

    def after_log_probs(self, run: Any, batch: DataProto, log: StepLog) -> None:
        for hook in self.hooks:
            hook.after_log_probs(run, batch, log)

    def before_advantage(self, run: Any, batch: DataProto, log: StepLog) -> None:
        for hook in self.hooks:
            hook.before_advantage(run, batch, log)

    def train(self, run: Any, batch: DataProto, log: StepLog) -> DataProto | None:
        for hook in self.hooks:
            out = hook.train(run, batch, log)
            if out is not None:
                return out
        return None

    def trained_roles(self, groups: Any) -> dict[str, Any]:
        roles: dict[str, Any] = {}
        for hook in self.hooks:
            roles.update(hook.trained_roles(groups))
        return roles

    def before_step_metrics(self, batch: DataProto, log: StepLog) -> None:
        for hook in self.hooks:
            hook.before_step_metrics(batch, log)

    def after_step_metrics(self, metrics: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.after_step_metrics(metrics)


def hooks_for(config) -> Hooks:
    """The hooks a configuration asks for: ``trainer.recipe`` spin / prime, ``distillation.enabled``."""
    hooks: list[StageHook] = []
    if config.trainer.recipe == "spin":
        from hybridflow.trainer.hooks.spin import SpinHook

        hooks.append(SpinHook(config))
    elif config.trainer.recipe == "prime":
        from hybridflow.trainer.hooks.prime import PrimeHook

        hooks.append(PrimeHook(config))
    if config.distillation.enabled:
        from hybridflow.trainer.hooks.distillation import DistillationHook

        hooks.append(DistillationHook(config))
    return Hooks(hooks)
