"""The step plan: which stages a configuration runs and where pi_old comes from -- decided once, here.

``plan_step(config)`` is a pure function of the configuration: the check pipeline calls it (stage ``plan``, which
refuses what it cannot plan), the launch passes its result to the controller, and ``--dry-run`` prints it; nothing
is written back into the config, and the rule for "may the rollout's log-probs stand in for pi_old" exists in one
place.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.v1 import v1_mode

__all__ = ["StepPlan", "plan_step"]


@dataclass(frozen=True)
class StepPlan:
    """Which stages this configuration needs; decided once from the config, read by every step.

    Old log-probs (pi_old of the PPO ratio, Schulman et al. 2017, eq. 7) come from one of three places:

    * ``reuse_rollout_log_probs``: the rollout's own log-probs (``rollout.calculate_log_probs=true``) when the
      update is exactly on-policy (one optimiser step on the batch -- or any number with
      ``rollout.exact_log_probs``, whose log-probs equal the recomputation bit for bit --, synchronous training,
      no IS/RS correction)
      or ``rollout_correction.bypass_mode`` asks for them explicitly (fully async ``use_rollout_log_probs``
      without ``compute_prox_log_prob`` is verl's bypass default there) -- never for ``optimal_token_baseline`` /
      ``calculate_sum_pi_squared``, whose advantages need the actor pass's ``sum_pi_squared``;
      ``actor/entropy`` and ``training/rollout_probs_diff_*`` then come from the update's first forward pass;
    * ``old_log_prob_in_update`` (the default for GRPO-style runs): the update is one optimiser step over
      the whole batch -- ``actor.ppo_epochs == 1`` and ``actor.ppo_mini_batch_size >= data.train_batch_size``
      -- and nothing reads ``old_log_probs`` before it: ``algorithm.use_kl_in_reward=false``, rollout
      correction off, no ``optimal_token_baseline`` and the rollout log-probs not reused.  Then pi_old *is* the
      policy being differentiated, its log-prob is ``log_prob.detach()`` of the update's own forward pass (ratio
      1, the clipped objective's gradient is the plain policy gradient -- what TRL does for
      ``num_iterations=1``), so the separate ``old_log_prob`` forward pass is skipped;
    * otherwise the actor's ``compute_log_prob`` forward pass (the ``old_log_prob`` stage).

    Async training (one_step_off / fully_async, V1's colocate_async / separate_async) trains on batches sampled by older weights, so the rollout's
    log-probs are pi_old only when asked for explicitly (bypass).  Taking pi_old from the update's own pass stays
    exact there: it *is* the recomputation with the current weights.
    """

    n: int
    use_critic: bool
    use_ref: bool
    use_rm: bool
    use_kl_in_reward: bool
    reuse_rollout_log_probs: bool
    old_log_prob_in_update: bool
    remax_baseline: bool
    filter_groups: bool
    critic_warmup: int
    ref_update_freq: int = -1  # > 0: the reference takes the actor's weights at steps k, 2k, ... (1-based)
    distillation: bool = False  # teachers score the samples; the actor adds the distillation term
    recipe: str | None = None  # trainer.recipe: spin | sppo | prime (their stage hooks: trainer/hooks/)

    @classmethod
    def from_config(cls, config) -> "StepPlan":
        """The plan of ``config`` (:func:`plan_step`)."""
        return plan_step(config)

    def refresh_reference_at(self, step: int) -> bool:
        """Whether the reference takes the actor's weights before step ``step`` (1-based) is scored: every
        ``trainer.ref_update_freq`` steps, at the start of the step (verl-recipe's SPIN)."""
        return self.use_ref and self.ref_update_freq > 0 and step % self.ref_update_freq == 0

    @property
    def pi_old_source(self) -> str:
        """Where pi_old comes from, in words (for ``--dry-run``)."""
        if self.reuse_rollout_log_probs:
            return "the rollout's own log-probs (no old_log_prob pass)"
        if self.old_log_prob_in_update:
            return "the update's own forward pass, detached (exactly on-policy: no old_log_prob pass)"
        return "the actor's old_log_prob forward pass"

    def describe(self) -> list[str]:
        """The stages one step runs, in order, with where pi_old comes from."""
        stages = ["update_ref (every %d steps)" % self.ref_update_freq] if self.use_ref and self.ref_update_freq > 0 \
            else []
        stages += ["generate (rollout.n=%d)" % self.n, "reward" + (" (reward model)" if self.use_rm else "")]
        if self.recipe == "prime":
            stages.append("prime: accuracy filter, implicit PRM scores and update")
        if self.distillation:
            stages.append("teacher_log_probs")
        if not (self.reuse_rollout_log_probs or self.old_log_prob_in_update):
            stages.append("old_log_prob")
        if self.use_ref:
            stages.append("ref_log_prob")
        if self.use_critic:
            stages.append("values")
        stages.append("advantage" + (" (ReMax greedy baseline)" if self.remax_baseline else ""))
        if self.use_critic:
            stages.append("update_critic")
        if self.recipe == "spin":
            stages.append("update_actor (DPO on pairs)")
        else:
            stages.append("update_actor" + (f" (after {self.critic_warmup} critic-only steps)" if self.critic_warmup
                                            else ""))
        return [f"stages: {' -> '.join(stages)}" + (" (DAPO group filtering)" if self.filter_groups else ""),
                f"pi_old: {self.pi_old_source}"]


def plan_step(config) -> StepPlan:
    """Decide the plan (see :class:`StepPlan`); raises ``ValueError`` for ReMax with a sampling baseline."""
    arr = config.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    one_mini_batch = actor.ppo_mini_batch_size >= config.data.train_batch_size and actor.ppo_epochs == 1
    rc = config.algorithm.rollout_correction
    at = config.async_training
    on_policy = at.mode == "sync" and v1_mode(config) in (None, "sync")  # V1 async modes: older versions
    bypass = bool(rc.bypass_mode) or (
        at.mode == "fully_async" and at.use_rollout_log_probs and not at.compute_prox_log_prob)
    corrects = rc.rollout_is is not None or rc.rollout_rs is not None  # IS/RS compare the actor's pi_old with mu
    otb = config.algorithm.adv_estimator == "optimal_token_baseline" or bool(actor.calculate_sum_pi_squared)
    # rollout.exact_log_probs: the rollout's log-probs ARE the actor's recomputation (bit for bit), so on-policy they
    # stand in for the old_log_prob pass whatever the number of mini-batches and epochs
    exact = bool(getattr(rollout, "exact_log_probs", False))
    reuse = bool(rollout.calculate_log_probs) and not otb and (
        ((one_mini_batch or exact) and not corrects and on_policy) or bypass)
    in_update = (one_mini_batch and not reuse and not (corrects or bypass) and not otb
                 and not bool(config.algorithm.use_kl_in_reward))
    remax = config.algorithm.adv_estimator == "remax"
    vk = rollout.val_kwargs
    if remax and vk.do_sample and vk.temperature > 0:
        raise ValueError(
            "algorithm.adv_estimator=remax draws its greedy baseline with actor_rollout_ref.rollout.val_kwargs, "
            f"which sample (do_sample={vk.do_sample}, temperature={vk.temperature}); set "
            "actor_rollout_ref.rollout.val_kwargs.do_sample=false"
        )
    return StepPlan(
        n=int(rollout.n),
        use_critic=bool(config.use_critic),
        use_ref=bool(config.use_reference_policy),
        # a reward-model worker scores the batch -- not PRIME's PRM (its own stage) nor a judge (asked by the reward
        # functions)
        use_rm=bool(config.reward_model.enable) and config.trainer.recipe != "prime" and not config.uses_judge,
        use_kl_in_reward=bool(config.algorithm.use_kl_in_reward),
        reuse_rollout_log_probs=reuse,
        old_log_prob_in_update=in_update,
        remax_baseline=remax,
        filter_groups=bool(config.algorithm.filter_groups.enable),
        critic_warmup=int(config.trainer.critic_warmup),
        ref_update_freq=int(config.trainer.ref_update_freq),
        distillation=bool(config.distillation.enabled),
        recipe=config.trainer.recipe,
    )
