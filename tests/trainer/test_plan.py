"""Which stages a configuration runs, and the step budget (pure config logic, no models)."""

from __future__ import annotations

import pytest

from hybridflow.launch.config import load_config
from hybridflow.trainer.modes import run_length
from hybridflow.trainer.stages import StepPlan

A = "actor_rollout_ref"
BASE = ["data.train_batch_size=8", f"{A}.actor.ppo_mini_batch_size=8", f"{A}.rollout.n=4",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "trainer.n_gpus_per_node=1", f"{A}.rollout.name=hf"]


def plan(*overrides):
    return StepPlan.from_config(load_config([*BASE, *overrides]))


def test_stage_selection():
    grpo = plan("algorithm.adv_estimator=grpo")
    assert not grpo.use_critic and not grpo.use_ref and not grpo.remax_baseline and grpo.n == 4
    assert plan("algorithm.adv_estimator=grpo", f"{A}.actor.use_kl_loss=true").use_ref
    assert plan("algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=true").use_ref
    gae = plan("algorithm.adv_estimator=gae", "trainer.critic_warmup=3")
    assert gae.use_critic and gae.critic_warmup == 3
    assert plan("algorithm.adv_estimator=remax").remax_baseline


def test_rollout_log_probs_reused_only_when_exactly_on_policy():
    on_policy = [f"{A}.rollout.calculate_log_probs=true"]
    assert plan(*on_policy).reuse_rollout_log_probs
    assert not plan().reuse_rollout_log_probs  # the rollout was not asked for its log-probs
    assert not plan(*on_policy, f"{A}.actor.ppo_epochs=2").reuse_rollout_log_probs
    assert not plan(*on_policy, f"{A}.actor.ppo_mini_batch_size=4").reuse_rollout_log_probs
    assert plan(*on_policy, f"{A}.actor.ppo_mini_batch_size=4",
                "algorithm.rollout_correction.bypass_mode=true").reuse_rollout_log_probs


def test_old_log_probs_from_the_update_only_when_nothing_needs_them_before_it():
    """Decision table of ``StepPlan.old_log_prob_in_update`` (the default GRPO/PPO step is on-policy)."""
    assert plan().old_log_prob_in_update  # one epoch, one mini-batch covering the batch
    assert plan("algorithm.adv_estimator=gae").old_log_prob_in_update  # the critic does not read old log-probs
    assert plan(f"{A}.actor.use_kl_loss=true").old_log_prob_in_update  # KL loss compares with pi_theta, not pi_old
    off_policy_or_read_early = [
        [f"{A}.actor.ppo_epochs=2"],
        [f"{A}.actor.ppo_mini_batch_size=4"],  # two optimiser steps on the batch
        ["algorithm.use_kl_in_reward=true"],  # the reward's KL penalty reads old_log_probs before the update
        ["algorithm.rollout_correction.rollout_is=token", f"{A}.rollout.calculate_log_probs=true"],
        ["algorithm.rollout_correction.rollout_rs=token", "algorithm.rollout_correction.rollout_rs_threshold=2.0",
         f"{A}.rollout.calculate_log_probs=true"],
        ["algorithm.adv_estimator=optimal_token_baseline", f"{A}.actor.calculate_sum_pi_squared=true"],
        ["algorithm.rollout_correction.bypass_mode=true", f"{A}.rollout.calculate_log_probs=true"],
        [f"{A}.rollout.calculate_log_probs=true"],  # the rollout's own log-probs are reused instead
    ]
    for overrides in off_policy_or_read_early:
        assert not plan(*overrides).old_log_prob_in_update, overrides
    reused = plan(f"{A}.rollout.calculate_log_probs=true")
    assert reused.reuse_rollout_log_probs and not reused.old_log_prob_in_update
    # IS weights compare the actor's pi_old with the rollout's mu, so the rollout's log-probs are not reused as pi_old
    corrected = plan(f"{A}.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_is=token")
    assert not corrected.reuse_rollout_log_probs and not corrected.old_log_prob_in_update


def test_remax_needs_greedy_baseline_sampling():
    with pytest.raises(ValueError, match="val_kwargs.do_sample=false"):
        plan("algorithm.adv_estimator=remax", f"{A}.rollout.val_kwargs.do_sample=true",
             f"{A}.rollout.val_kwargs.temperature=1.0")


def test_run_length_is_returned_not_written_into_the_config():
    cfg = load_config([*BASE, "trainer.total_epochs=3"])
    before = cfg.actor_rollout_ref.actor.optim.total_training_steps
    assert run_length(cfg, steps_per_epoch=5) == (15, 15)
    assert cfg.actor_rollout_ref.actor.optim.total_training_steps == before  # the horizon goes to init_model
    cfg = load_config([*BASE, "trainer.total_training_steps=4"])
    assert run_length(cfg, steps_per_epoch=5) == (4, 4)
    with pytest.raises(ValueError, match="train_batch_size=8"):
        run_length(cfg, steps_per_epoch=0)
