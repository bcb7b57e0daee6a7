"""On-policy distillation's stage (verl 0.9's ``distillation.*``): after the log-prob passes, each sample's teacher
scores it (``teacher_log_probs``, routed by ``distillation.teacher_key``) and the actor's loss adds the
distillation term with the settings of ``distillation.distillation_loss`` (``algorithms/distillation.py``).
The teachers' worker groups are started with the run (``trainer/teachers.py``)."""

from __future__ import annotations

from hybridflow.algorithms.distillation import DISTILLATION_SETTINGS, TEACHER_TOPK, DistillationSettings
from hybridflow.protocol import DataProto
from hybridflow.trainer import stages
from hybridflow.trainer.hooks import StageHook
from hybridflow.trainer.step_log import StepLog

__all__ = ["DistillationHook", "distillation_settings"]


def distillation_settings(config) -> DistillationSettings:
    """The actor's distillation-loss settings from ``distillation.distillation_loss``."""
    loss = config.distillation.distillation_loss
    return DistillationSettings(
        loss_mode=loss.loss_mode, use_task_rewards=bool(loss.use_task_rewards),
        distillation_loss_coef=float(loss.distillation_loss_coef), loss_max_clamp=loss.loss_max_clamp,
        log_prob_min_clamp=loss.log_prob_min_clamp, use_policy_gradient=bool(loss.use_policy_gradient),
        clip_ratio=float(loss.clip_ratio), clip_ratio_low=float(loss.clip_ratio_low),
        clip_ratio_high=float(loss.clip_ratio_high), topk=int(loss.topk or 0),
    )


class DistillationHook(StageHook):
    """The teachers' log-probs after the actor's and the reference's (``timing_s/teacher``)."""

    name = "distillation"

    def __init__(self, config):
        self.settings = distillation_settings(config)

    def after_log_probs(self, run, batch: DataProto, log: StepLog) -> None:
        if self.settings.topk_mode:
            batch.meta_info[TEACHER_TOPK] = int(self.settings.topk)
        with log.timed("teacher"):
            log.update(stages.compute_teacher_log_probs(run.groups, batch))
        batch.meta_info[DISTILLATION_SETTINGS] = self.settings
