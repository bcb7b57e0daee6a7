"""RL algorithms as pure tensor functions, with verl's names and calling conventions.

Nothing here touches models, I/O or ``torch.distributed``: the trainer calls the batch-level stages
(:func:`apply_kl_penalty`, :func:`compute_advantage`) on the controller and the engine calls the losses
per micro-batch.  Custom estimators/losses written for verl register unchanged with
:func:`register_adv_est` / :func:`register_policy_loss`.

For the engine author — split-invariant losses
----------------------------------------------
Per mini-batch (one optimizer step):

1. ``counts = count_loss_normalizers(micro.response_mask)`` for every micro-batch of the rank; sum
   them, then all-reduce (SUM) over the DP group.  This gives ``global_token_num`` (valid tokens) and
   ``global_batch_size`` (non-empty sequences) of the whole mini-batch.
2. ``cfg = with_global_batch_info(actor_cfg, **counts, dp_size=D, loss_scale_factor=L)`` where ``D`` is
   the DP world size when the gradient reduction averages over ranks (FSDP/DDP) and ``L`` is
   ``actor_cfg.loss_scale_factor`` or a constant such as the max response length (needed for
   ``seq-mean-token-sum-norm`` to be split-invariant).
3. For each micro-batch: ``pg_loss, m = get_policy_loss_fn(mode)(old_lp, lp, adv, mask,
   actor_cfg.loss_agg_mode, cfg, rollout_is_weights)``; KL / entropy terms use
   ``agg_loss(..., **cfg.global_batch_info)`` and the critic ``compute_value_loss(...,
   **cfg.global_batch_info)``.  ``backward()`` each micro-batch loss as is — no ``1/grad_accum``.

Then the accumulated (and rank-averaged) gradient is exactly the gradient of the whole mini-batch loss,
whatever the micro-batch sizes or token budgets.  The exception is ``clip_cov``/``kl_cov``, whose
covariance statistics are per micro-batch by design.  Metrics come back as detached 0-dim tensors.
"""

from .advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from .aggregation import LOSS_AGG_MODES, agg_loss, check_loss_agg_mode, count_loss_normalizers
from .batch_ops import AdvantageSettings, apply_kl_penalty, compute_advantage, compute_response_mask
from .cov_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from .entropy import (
    compute_entropy_loss,
    entropy_from_logits,
    entropy_from_logits_with_chunking,
    logprobs_from_logits,
)
from .kl import KL_PENALTY_NAMES, full_kl, kl_penalty
from .kl_controllers import AdaptiveKLController, FixedKLController, get_kl_controller
from .loss_config import GlobalBatchConfig, with_global_batch_info
from .masked import masked_mean, masked_sum, masked_var, masked_whiten
from .outcome_advantages import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    group_mean_std,
)
from .pf_ppo import compute_pf_ppo_reweight_data
from . import distillation, dppo_losses, gdpo, preference, prime, sppo  # noqa: F401 - register the recipes' estimators and losses
from .policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from .registries import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    UnknownAlgorithmError,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from .reward_shaping import compute_overlong_penalty
from .token_baseline import compute_optimal_token_baseline_advantage, sum_pi_squared_from_logits
from .rollout_correction import (
    compute_offpolicy_metrics,
    compute_rollout_correction_weights,
    compute_rollout_is_weights,
    compute_rollout_rejection_mask,
)
from .value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageSettings",
    "FixedKLController",
    "GlobalBatchConfig",
    "KL_PENALTY_NAMES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "UnknownAlgorithmError",
    "agg_loss",
    "apply_kl_penalty",
    "check_loss_agg_mode",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_offpolicy_metrics",
    "compute_opo_outcome_advantage",
    "compute_overlong_penalty",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_response_mask",
    "compute_rloo_outcome_advantage",
    "compute_rollout_correction_weights",
    "compute_rollout_is_weights",
    "compute_rollout_rejection_mask",
    "compute_value_loss",
    "count_loss_normalizers",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "full_kl",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "group_mean_std",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
    "compute_optimal_token_baseline_advantage",
    "sum_pi_squared_from_logits",
    "with_global_batch_info",
]
