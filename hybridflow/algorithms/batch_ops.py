"""The two algorithm stages the trainer runs on the controller over a whole batch (``DataProto``).

* :func:`apply_kl_penalty`  token_level_rewards = token_level_scores − β·KL(old_log_probs ‖ ref_log_prob)
* :func:`compute_advantage` dispatches to the registered estimator and writes ``advantages``/``returns``
"""

from __future__ import annotations

import inspect

from typing import Any

import torch

from hybridflow.protocol import DataProto

from .kl import kl_penalty as kl_estimate
from .masked import masked_mean
from .pf_ppo import compute_pf_ppo_reweight_data
from .registries import AdvantageEstimator, get_adv_estimator_fn

__all__ = [
    "OLD_LOG_PROBS_FROM_UPDATE", "PI_OLD_WEIGHTS", "PI_OLD_DIAGNOSTICS_IN_UPDATE", "ROLLOUT_CORRECTION_BYPASS", "AdvantageSettings", "apply_kl_penalty", "compute_advantage", "compute_response_mask",
]

# ``meta_info`` flag on a training batch: pi_old is the detached log-prob of the update's own forward pass
# (set by the trainer when the update is exactly on-policy, read by the actor).
OLD_LOG_PROBS_FROM_UPDATE = "old_log_probs_from_update"
# ``meta_info`` entry on a log-prob batch: compute it with the actor weights saved under this name (verl V1
# separate_async's decoupled PPO: every mini-batch of a weight version gets pi_old from the version's weights).
PI_OLD_WEIGHTS = "pi_old_weights"
# ``meta_info`` flag: no actor log-prob pass ran before the update (pi_old came from the update itself or from the
# rollout), so the actor reports ``actor/entropy`` and ``training/rollout_probs_diff_*`` from its first forward
# pass -- the one that runs before any optimiser step, i.e. exactly at pi_old.
PI_OLD_DIAGNOSTICS_IN_UPDATE = "pi_old_diagnostics_in_update"
# ``meta_info`` entry (a ``bypass_loss.BypassSettings``): rollout-correction bypass mode -- ``old_log_probs`` are
# the rollout's, and the actor's loss corrects the mismatch against the policy being trained.
ROLLOUT_CORRECTION_BYPASS = "rollout_correction_bypass"


class AdvantageSettings:
    """The estimator's ``config``: explicit ``gamma``/``lam``/``norm_adv_by_std_in_grpo`` over the
    algorithm config, whose other attributes (custom estimators may read them) fall through."""

    def __init__(self, gamma: float, lam: float, norm_adv_by_std_in_grpo: bool, base: Any = None):
        self.gamma = gamma
        self.lam = lam
        self.norm_adv_by_std_in_grpo = norm_adv_by_std_in_grpo
        self.base = base

    def __getattr__(self, name: str):
        if name == "base" or self.base is None:
            raise AttributeError(name)
        return getattr(self.base, name)


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """``response_mask`` from the batch, or the response part of ``attention_mask`` when it is missing."""
    if "response_mask" in data.batch:
        return data.batch["response_mask"]
    if "responses" not in data.batch or "attention_mask" not in data.batch:
        raise KeyError("the batch needs 'response_mask' (or 'responses' and 'attention_mask' to derive it)")
    length = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -length:]


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl") -> tuple[DataProto, dict[str, float]]:
    """KL-in-reward (Ziegler et al. 2019; Ouyang et al. 2022): r_t = s_t − β·kl_t on valid tokens, with
    kl_t = ``kl_penalty(old_log_probs, ref_log_prob)`` and β = ``kl_ctrl.value``.

    The controller is then updated with the batch KL (mean over sequences of the per-sequence token
    mean) and n_steps = batch size.  Metrics: ``actor/reward_kl_penalty`` (that KL) and
    ``actor/reward_kl_penalty_coeff`` (the β used).
    """
    for key in ("token_level_scores", "old_log_probs", "ref_log_prob"):
        if key not in data.batch:
            raise KeyError(f"apply_kl_penalty needs '{key}' in the batch")
    mask = compute_response_mask(data)
    kld = kl_estimate(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty)
    kld = torch.where(mask.bool(), kld, 0.0)
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def _accepts_keyword(fn, name: str) -> bool:
    """Whether ``fn`` takes ``name`` explicitly (a verl-ported custom estimator may not take ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    return name in params


def compute_advantage(
    data: DataProto,
    adv_estimator: str | AdvantageEstimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """Compute ``advantages`` and ``returns`` with the estimator registered as ``adv_estimator``.

    Reads ``token_level_rewards``, ``response_mask`` and, when present, ``values``,
    ``reward_baselines``, ``old_log_probs``, ``sum_pi_squared`` and the non-tensor ``uid`` (group ids).  ``config`` is the algorithm config;
    with ``config.use_pf_ppo`` the batch is then resampled by PF-PPO (for every estimator; verl does so
    only for ``gae``), seeded by ``meta_info['global_steps']`` when present.  ``num_repeat`` (rollout.n)
    is accepted for verl compatibility; groups come from ``uid``.
    """
    if "token_level_rewards" not in data.batch:
        raise KeyError("compute_advantage needs 'token_level_rewards' (run the reward stage / apply_kl_penalty first)")
    mask = compute_response_mask(data)
    data.batch["response_mask"] = mask
    estimator = get_adv_estimator_fn(adv_estimator)
    kwargs: dict[str, Any] = {
        "token_level_rewards": data.batch["token_level_rewards"],
        "response_mask": mask,
        "config": AdvantageSettings(gamma, lam, norm_adv_by_std_in_grpo, base=config),
    }
    if "uid" in data.non_tensor_batch:
        kwargs["index"] = data.non_tensor_batch["uid"]
    for key in ("values", "reward_baselines"):
        if key in data.batch:
            kwargs[key] = data.batch[key]
    # only to estimators that name them: OTB reads pi_old; PRIME its process rewards, outcome labels and the scores
    for key in ("old_log_probs", "sum_pi_squared", "process_rewards", "acc", "token_level_scores"):
        if key in data.batch and _accepts_keyword(estimator, key):
            kwargs[key] = data.batch[key]
    if _accepts_keyword(estimator, "non_tensor_batch"):  # GDPO's reward components (the reward function's dict)
        kwargs["non_tensor_batch"] = data.non_tensor_batch
    advantages, returns = estimator(**kwargs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    if config is not None and config.use_pf_ppo:
        steps = data.meta_info.get("global_steps")
        data = compute_pf_ppo_reweight_data(
            data, config.pf_ppo.reweight_method, config.pf_ppo.weight_pow, seed=None if steps is None else int(steps)
        )
    return data
