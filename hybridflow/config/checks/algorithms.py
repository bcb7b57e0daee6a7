"""Algorithm settings and their combinations (the names are checked against the registries by
``algorithms/checks.py``)."""

from __future__ import annotations

from hybridflow.config.schema import PPOConfig

__all__ = ["check_group_size", "check_rollout_correction"]


ROLLOUT_IS_LEVELS = ("token", "sequence")
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def check_rollout_correction(cfg: PPOConfig, errors: list[str]) -> None:
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    calc = cfg.actor_rollout_ref.rollout.calculate_log_probs
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS_LEVELS:
        errors.append(f"{key}.rollout_is={rc.rollout_is!r}: choose null, {' or '.join(ROLLOUT_IS_LEVELS)}")
    # the threshold grammar (lower_upper, several criteria) is the algorithm floor's: algorithms/checks.py
    if (rc.rollout_is is not None or rc.rollout_rs is not None) and not calc:
        errors.append(f"{key}.rollout_is/rollout_rs compare the actor's log-probs with the rollout's own: set "
                      "actor_rollout_ref.rollout.calculate_log_probs=true")
    if rc.loss_type not in BYPASS_LOSS_TYPES:
        errors.append(f"{key}.loss_type={rc.loss_type!r}: choose one of {', '.join(BYPASS_LOSS_TYPES)}")
    elif rc.loss_type != "ppo_clip" and not rc.bypass_mode:
        errors.append(f"{key}.loss_type={rc.loss_type} selects the bypass-mode loss and acts only with "
                      f"{key}.bypass_mode=true; in decoupled mode the loss is actor_rollout_ref.actor.policy_loss."
                      "loss_mode (set bypass_mode=true, or drop loss_type)")
    if not rc.bypass_mode:
        return
    if not calc:
        errors.append(f"{key}.bypass_mode=true uses the rollout's log-probs as pi_old: set "
                      "actor_rollout_ref.rollout.calculate_log_probs=true")
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode != "vanilla":
        errors.append(f"{key}.bypass_mode=true replaces the policy loss (loss_type=ppo_clip: PPO clip against the "
                      f"rollout's log-probs; reinforce: IS-weighted REINFORCE), so actor_rollout_ref.actor.policy_loss."
                      f"loss_mode={mode} would be ignored: leave loss_mode=vanilla or set bypass_mode=false")
    if cfg.algorithm.adv_estimator == "optimal_token_baseline":
        errors.append(f"{key}.bypass_mode=true skips the actor's log-prob pass, which is where "
                      "algorithm.adv_estimator=optimal_token_baseline gets sum_pi_squared: use one or the other")


def check_group_size(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """Group estimators with ``rollout.n=1``: each prompt is a group of one (verl's singleton rule)."""
    est, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if n != 1:
        return
    if est == "grpo_passk":
        errors.append("algorithm.adv_estimator=grpo_passk credits the best of each prompt's responses over the "
                      "second best, which needs actor_rollout_ref.rollout.n >= 2")
    elif est in ("grpo", "rloo"):
        notes.append(f"algorithm.adv_estimator={est} with actor_rollout_ref.rollout.n=1: every prompt is a group of "
                     "one, so there is no group baseline and the advantage is the raw score (REINFORCE without a "
                     "baseline). Set rollout.n >= 2 for the group-relative advantage.")
    elif est == "reinforce_plus_plus_baseline":
        notes.append("algorithm.adv_estimator=reinforce_plus_plus_baseline with actor_rollout_ref.rollout.n=1: every "
                     "prompt is a group of one, so no group mean is subtracted and the scores are only whitened over "
                     "the batch (the same as reinforce_plus_plus). Set rollout.n >= 2 for the group baseline.")
