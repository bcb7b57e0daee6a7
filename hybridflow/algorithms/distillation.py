"""On-policy distillation: a teacher's log-probs on the student's own samples give a per-token reverse-KL signal
(Agarwal et al. 2024, GKD, arXiv:2306.13649; the "on-policy distillation" recipe of Lu & Thinking Machines 2025),
with verl 0.9's ``distillation.distillation_loss.*`` settings.

For response token t sampled from the student π_s, with teacher π_T, the single-sample estimators of
KL(π_s ‖ π_T) (Schulman 2020, "Approximating KL divergence") are, with d_t = log π_s(y_t) − log π_T(y_t)::

    k1 / kl        d_t                     (unbiased, can be negative)
    abs            |d_t|
    k2 / mse       d_t² / 2
    k3 / low_var_kl  exp(−d_t) + d_t − 1   (unbiased, ≥ 0)

Two ways to learn from them (``use_policy_gradient``):

* as a **reward**: advantage_t = −loss_t (detached, per token: no return-to-go), trained with the vanilla PPO
  clipped loss (``clip_ratio*`` of the distillation node); with k1 this is exactly the per-token reverse-KL
  reward -d_t, whose policy gradient is the gradient of the reverse KL;
* as a **loss**: the estimator itself is back-propagated through log π_s (``k3``/``k2`` are the useful ones; k1's
  gradient does not depend on the teacher and is refused).

**Top-k forward KL** (``loss_mode=forward_kl_topk``, a loss only): the teacher reports its ``topk`` most likely tokens
at every response position (ids and log-probs) and the student's loss is the forward KL restricted to them,
sum_k p_T(v_k) (log p_T(v_k) - log p_s(v_k)), whose gradient reaches the student's whole distribution there (not
only the sampled token; a truncated KL, so it can dip below 0); ``distillation/{student,teacher}_mass`` report the
probability the top-k tokens hold.

``use_task_rewards``: the task's PPO loss is kept and the distillation term is added with
``distillation_loss_coef``; otherwise the distillation term alone trains the student (coefficient 1).
``log_prob_min_clamp`` floors both log-probs before the estimator, ``loss_max_clamp`` clamps the per-token value
to ±c.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .aggregation import agg_loss
from .kl import kl_penalty
from .loss_config import agg_kwargs
from .masked import masked_mean
from .policy_losses import compute_policy_loss_vanilla

__all__ = ["DISTILLATION_LOSS_MODES", "DistillationSettings", "distillation_token_losses", "compute_distillation_loss",
           "forward_kl_topk_losses", "TEACHER_LOG_PROBS", "TEACHER_TOPK", "TEACHER_TOPK_IDS", "TEACHER_TOPK_LOG_PROBS",
           "DISTILLATION_SETTINGS"]

DISTILLATION_LOSS_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "forward_kl_topk")
# batch key of the teacher's log-probs of the student's response tokens (B, R)
TEACHER_LOG_PROBS = "teacher_log_probs"
# forward_kl_topk: batch keys of the teacher's top-k (B, R, k) ids and log-probs, and the ``meta_info`` entry asking a
# teacher for them (its value: k)
TEACHER_TOPK_IDS = "teacher_topk_ids"
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"
TEACHER_TOPK = "teacher_topk"
# ``meta_info`` entry of a training batch (a :class:`DistillationSettings`): the actor adds the distillation term
DISTILLATION_SETTINGS = "distillation_settings"


@dataclass(frozen=True)
class DistillationSettings:
    """The distillation loss settings the actor needs (travels in ``meta_info``; see the module docstring)."""

    loss_mode: str = "k3"
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    use_policy_gradient: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    topk: int = 32

    def __post_init__(self):
        if self.loss_mode not in DISTILLATION_LOSS_MODES:
            raise ValueError(f"distillation.distillation_loss.loss_mode={self.loss_mode!r}: choose one of "
                             f"{', '.join(DISTILLATION_LOSS_MODES)}")
        if self.topk_mode and (self.use_policy_gradient or int(self.topk) < 1):
            raise ValueError("distillation.distillation_loss.loss_mode=forward_kl_topk is a loss over the teacher's "
                             "top-k tokens: set use_policy_gradient=false and topk >= 1")
        if not self.use_policy_gradient and self.loss_mode in ("k1", "kl"):
            raise ValueError("distillation.distillation_loss.loss_mode=k1 with use_policy_gradient=false: the gradient "
                             "of k1 = log p_student - log p_teacher does not depend on the teacher; use k3 (or k2) as "
                             "a loss, or set use_policy_gradient=true to use k1 as a reward")

    @property
    def topk_mode(self) -> bool:
        """The teacher's top-k distribution (not the sampled token's log-prob) drives the term."""
        return self.loss_mode == "forward_kl_topk"

    @property
    def task_coef(self) -> float:
        """Weight of the task's policy loss (0 without task rewards)."""
        return 1.0 if self.use_task_rewards else 0.0

    @property
    def coef(self) -> float:
        """Weight of the distillation term (``distillation_loss_coef`` only when task rewards are kept)."""
        return float(self.distillation_loss_coef) if self.use_task_rewards else 1.0


def distillation_token_losses(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor,
                              settings: DistillationSettings) -> torch.Tensor:
    """(B, R) per-token estimator values (module docstring), clamped as configured."""
    s, t = student_log_prob, teacher_log_prob.to(student_log_prob.dtype)
    if settings.log_prob_min_clamp is not None:
        s, t = s.clamp(min=settings.log_prob_min_clamp), t.clamp(min=settings.log_prob_min_clamp)
    losses = kl_penalty(s, t, settings.loss_mode)
    if settings.loss_max_clamp is not None:
        c = float(settings.loss_max_clamp)
        losses = losses.clamp(min=-c, max=c)
    return losses


def forward_kl_topk_losses(student_topk_log_probs: torch.Tensor, teacher_topk_log_probs: torch.Tensor,
                           settings: DistillationSettings) -> torch.Tensor:
    """(B, R) forward KL over the teacher's top-k tokens, sum_k p_T (log p_T - log p_s), clamped as configured."""
    s, t = student_topk_log_probs.float(), teacher_topk_log_probs.float()
    if settings.log_prob_min_clamp is not None:
        s, t = s.clamp(min=settings.log_prob_min_clamp), t.clamp(min=settings.log_prob_min_clamp)
    losses = (t.exp() * (t - s)).sum(dim=-1)
    if settings.loss_max_clamp is not None:
        losses = losses.clamp(max=float(settings.loss_max_clamp))
    return losses


class _ClipView:
    """The clip settings of the distillation node with the actor config's global normalisers."""

    def __init__(self, settings: DistillationSettings, config: Any):
        self.clip_ratio = settings.clip_ratio
        self.clip_ratio_low = settings.clip_ratio_low
        self.clip_ratio_high = settings.clip_ratio_high
        self.clip_ratio_c = 3.0
        self.global_batch_info = dict(getattr(config, "global_batch_info", None) or {})
        self.loss_scale_factor = getattr(config, "loss_scale_factor", None)


def compute_distillation_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, teacher_log_prob: torch.Tensor,
                              response_mask: torch.Tensor, loss_agg_mode: str, config: Any,
                              settings: DistillationSettings, topk: tuple[torch.Tensor, torch.Tensor] | None = None,
                              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation term of one micro-batch (not yet weighted by ``settings.coef``) and its metrics.

    ``config`` is the actor config view carrying the mini-batch's global normalisers; ``topk`` (forward_kl_topk):
    the student's and the teacher's log-probs of the teacher's top-k tokens, (B, R, k) each."""
    mask = response_mask.bool()
    metrics: dict[str, torch.Tensor] = {}
    if settings.topk_mode:
        if topk is None:
            raise ValueError("distillation loss_mode=forward_kl_topk needs the teacher's top-k log-probs in the batch "
                             "and the student's at those tokens")
        losses = forward_kl_topk_losses(topk[0], topk[1], settings)
        with torch.no_grad():
            metrics["distillation/student_mass"] = masked_mean(topk[0].float().exp().sum(-1), mask).detach()
            metrics["distillation/teacher_mass"] = masked_mean(topk[1].float().exp().sum(-1), mask).detach()
    else:
        losses = distillation_token_losses(log_prob, teacher_log_prob, settings)
    if settings.use_policy_gradient:
        term, pg = compute_policy_loss_vanilla(old_log_prob, log_prob, -losses.detach(), response_mask,
                                               loss_agg_mode, _ClipView(settings, config))
        metrics.update({f"distillation/{k.removeprefix('actor/')}": v for k, v in pg.items()})
    else:
        term = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs(config))
    with torch.no_grad():
        d = torch.where(mask, log_prob - teacher_log_prob.to(log_prob.dtype), torch.zeros_like(log_prob))
        metrics["distillation/abs_loss"] = masked_mean(losses.abs(), mask).detach()
        metrics["distillation/reverse_kl_k1"] = masked_mean(d, mask).detach()
    return term, metrics
