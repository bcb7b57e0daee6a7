"""This floor's configuration rule, run by the launch's check pipeline: the estimator and policy-loss names exist in
the registries (so names a user module registered pass)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.algorithms import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

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
