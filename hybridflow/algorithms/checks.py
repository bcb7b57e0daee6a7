"""This floor's configuration rules, run by the launch's check pipeline: the estimator and policy-loss names exist in
the registries (so names a user module registered pass), GDPO's reward components are named, and the
rollout-correction thresholds read as the correction reads them (``rollout_thresholds.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.algorithms import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from hybridflow.algorithms.rollout_thresholds import ThresholdError, parse_is_threshold, parse_rejection

if TYPE_CHECKING:
    from hybridflow.config.schema import PPOConfig

__all__ = ["check_algorithms"]


def check_algorithms(cfg: PPOConfig, errors: list[str]) -> None:
    """Names must exist in the algorithm registries (so custom registered ones are accepted)."""
    est = cfg.algorithm.adv_estimator
    if est not in ADV_ESTIMATOR_REGISTRY:
        errors.append(f"algorithm.adv_estimator={est!r}: {ADV_ESTIMATOR_REGISTRY.unknown_message(est)}")
    if est == "optimal_token_baseline" and not cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
        errors.append("algorithm.adv_estimator=optimal_token_baseline weights each token by the energy "
                      "1 - 2*pi + sum(pi^2), which needs the actor's sum_pi_squared: set "
                      "actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode not in POLICY_LOSS_REGISTRY:
        errors.append(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode!r}: "
                      f"{POLICY_LOSS_REGISTRY.unknown_message(mode)}")
    _check_gdpo(cfg.algorithm, errors)
    _check_thresholds(cfg.algorithm.rollout_correction, errors)


def _check_thresholds(rc, errors: list[str]) -> None:
    """``rollout_is_threshold`` / ``rollout_rs`` / ``rollout_rs_threshold`` read as the correction will read them."""
    try:
        parse_is_threshold(rc.rollout_is_threshold)
    except ThresholdError as e:
        errors.append(str(e))
    if rc.rollout_rs is None and rc.rollout_rs_threshold is not None:
        errors.append(f"algorithm.rollout_correction.rollout_rs_threshold={rc.rollout_rs_threshold!r} bounds the "
                      "rejection criteria of algorithm.rollout_correction.rollout_rs, which is null: name the criteria "
                      "(e.g. rollout_rs=token_k1) or drop the threshold")
    try:
        parse_rejection(rc.rollout_rs, rc.rollout_rs_threshold)
    except ThresholdError as e:
        errors.append(str(e))


def _check_gdpo(algo, errors: list[str]) -> None:
    """GDPO's reward components: named (strings) when adv_estimator=gdpo, one weight per key, unset otherwise."""
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    if algo.adv_estimator != "gdpo":
        if keys is not None or weights is not None:
            errors.append("algorithm.gdpo_reward_keys / gdpo_reward_weights are read by algorithm.adv_estimator=gdpo "
                          f"only (this run uses {algo.adv_estimator}): set adv_estimator=gdpo or drop them")
        return
    if not keys or not all(isinstance(k, str) and k for k in keys):
        errors.append(f"algorithm.adv_estimator=gdpo normalises each reward component apart: set "
                      f"algorithm.gdpo_reward_keys to the names of the entries the reward function returns in its "
                      f"dict (e.g. [accuracy_reward, format_reward]; got {keys!r})")
    elif weights is not None and len(weights) != len(keys):
        errors.append(f"algorithm.gdpo_reward_weights has {len(weights)} entries for the {len(keys)} "
                      "algorithm.gdpo_reward_keys: give one weight per key (or null for equal weights)")
