"""Mistakes that used to fail only after the first rollout (or with a wrong message) are caught when the config
loads, each with the key and the fix (issue 15, item 6)."""

from __future__ import annotations

import warnings

import pytest

from hybridflow.config import ConfigError, ConfigWarning
from hybridflow.launch.config import load_config

A = "actor_rollout_ref"
BASE = ["data.train_batch_size=8", f"{A}.actor.ppo_mini_batch_size=8", f"{A}.rollout.n=4",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "trainer.n_gpus_per_node=2"]


def notes_of(*overrides) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        load_config([*BASE, *overrides])
    return [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def test_optimal_token_baseline_with_rollout_log_probs_runs_the_actor_pass():
    """OTB needs sum_pi_squared from the actor's log-prob pass; with calculate_log_probs=true and one mini-batch
    the rollout's log-probs used to replace that pass, and the advantage stage then asked for a flag already set."""
    from hybridflow.trainer.stages import StepPlan

    cfg = load_config([*BASE, "algorithm.adv_estimator=optimal_token_baseline",
                       f"{A}.actor.calculate_sum_pi_squared=true", f"{A}.rollout.calculate_log_probs=true"])
    plan = StepPlan.from_config(cfg)
    assert not plan.reuse_rollout_log_probs and not plan.old_log_prob_in_update


@pytest.mark.parametrize("est", ["grpo", "rloo"])
def test_n_equal_one_note_says_the_advantage_is_the_raw_score(est):
    from hybridflow.algorithms import compute_advantage
    from hybridflow.protocol import DataProto
    import numpy as np
    import torch

    notes = notes_of(f"algorithm.adv_estimator={est}", f"{A}.rollout.n=1")
    (note,) = [n for n in notes if "rollout.n=1" in n]
    assert "raw score" in note and "will be 0" not in note
    # ... and that is what the estimator does
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.25]])
    data = DataProto.from_dict({"token_level_rewards": scores, "response_mask": torch.ones(2, 2)},
                               {"uid": np.array(["a", "b"], dtype=object)})
    adv = compute_advantage(data, est).batch["advantages"]
    assert torch.allclose(adv[:, 0], torch.tensor([1.0, 0.25]))


def test_grpo_passk_with_one_sample_is_refused():
    with pytest.raises(ConfigError, match=r"grpo_passk.*rollout.n >= 2"):
        load_config([*BASE, "algorithm.adv_estimator=grpo_passk", f"{A}.rollout.n=1"])


@pytest.mark.parametrize("do_sample", ["true", "false"])
def test_zero_training_temperature_is_refused(do_sample):
    with pytest.raises(ConfigError, match=r"rollout.temperature=0.0 with do_sample=" + do_sample) as e:
        load_config([*BASE, f"{A}.rollout.temperature=0", f"{A}.rollout.do_sample={do_sample}"])
    assert "val_kwargs" in str(e.value)
    load_config([*BASE, f"{A}.rollout.val_kwargs.temperature=0"])  # greedy validation stays fine


def test_deprecated_critic_micro_batch_size_reaches_the_forward_pass():
    cfg = load_config([*BASE, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=null",
                       "critic.ppo_micro_batch_size=8"])
    c = cfg.critic
    assert c.ppo_micro_batch_size_per_gpu == 4 and c.forward_micro_batch_size_per_gpu == 4
    # the forward size set on its own wins over the interpolated default
    cfg = load_config([*BASE, "algorithm.adv_estimator=gae", "critic.forward_micro_batch_size_per_gpu=2"])
    assert cfg.critic.forward_micro_batch_size_per_gpu == 2
    with pytest.raises(ConfigError, match="set only one of reward_model.micro_batch_size"):
        load_config([*BASE, "reward_model.micro_batch_size=8", "reward_model.micro_batch_size_per_gpu=2"])
    assert load_config([*BASE, "reward_model.micro_batch_size=8"]).reward_model.micro_batch_size_per_gpu == 4


def test_critic_forward_uses_the_converted_size(tiny_model_dir):
    """The converted size is what CriticWorker reads (it used to get None and fail in compute_values)."""
    from hybridflow.workers.critic import CriticWorker

    cfg = load_config([*BASE, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=null",
                       "critic.ppo_micro_batch_size=8", f"critic.model.path={tiny_model_dir}", f"{A}.model.path={tiny_model_dir}",
                       "trainer.n_gpus_per_node=1",
                       "critic.model.enable_gradient_checkpointing=false"])
    worker = CriticWorker(cfg.critic)
    worker.init_model(total_training_steps=1)
    assert worker.critic.forward_spec.micro_batch_size == 8


@pytest.mark.parametrize("role", [f"{A}.actor", "critic"])
def test_cosine_schedule_without_min_lr_ratio_is_refused(role):
    with pytest.raises(ConfigError, match=rf"{role}.optim.min_lr_ratio is null.*cosine"):
        load_config([*BASE, "algorithm.adv_estimator=gae", f"{role}.optim.lr_scheduler_type=cosine",
                     f"{role}.optim.min_lr_ratio=null"])
    with pytest.raises(ConfigError, match=r"min_lr_ratio=1.5 must lie in \[0, 1\]"):
        load_config([*BASE, "algorithm.adv_estimator=gae", f"{role}.optim.warmup_style=cosine",
                     f"{role}.optim.min_lr_ratio=1.5"])
    load_config([*BASE, f"{role}.optim.min_lr_ratio=null"])  # the constant schedule never reads it


def test_errors_exit_2_from_the_command_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hybridflow", "train", "--dry-run", *BASE,
                          f"{A}.rollout.temperature=0"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "actor_rollout_ref.rollout.temperature=0.0" in out.stderr


BYPASS = ["algorithm.adv_estimator=grpo", "algorithm.rollout_correction.bypass_mode=true"]


@pytest.mark.parametrize("overrides,message", [
    (BYPASS, r"bypass_mode=true uses the rollout's log-probs as pi_old: set .*calculate_log_probs=true"),
    (BYPASS + [f"{A}.rollout.calculate_log_probs=true", f"{A}.actor.policy_loss.loss_mode=gspo"],
     r"replaces the policy loss .*loss_mode=gspo would be ignored"),
    (["algorithm.adv_estimator=optimal_token_baseline", f"{A}.actor.calculate_sum_pi_squared=true",
      "algorithm.rollout_correction.bypass_mode=true", f"{A}.rollout.calculate_log_probs=true"],
     r"skips the actor's log-prob pass.*optimal_token_baseline"),
    (["algorithm.rollout_correction.loss_type=reinforce"], r"loss_type=reinforce .* acts only with .*bypass_mode=true"),
    (["algorithm.rollout_correction.loss_type=pg"], r"loss_type='pg': choose one of ppo_clip, reinforce"),
    ([f"{A}.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_rs=token"],
     r"rollout_rs=token .* set algorithm.rollout_correction.rollout_rs_threshold"),
    ([f"{A}.rollout.calculate_log_probs=true", "algorithm.rollout_correction.rollout_is=tokens"],
     r"rollout_is='tokens': choose null, token or sequence"),
])
def test_rollout_correction_combinations_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config([*BASE, *overrides])


@pytest.mark.parametrize("spelling", [
    ["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
     "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512"],  # verl-recipe's main_ppo layout
    ["reward_model.reward_manager=dapo", "+reward_model.overlong_buffer.enable=true",
     "+reward_model.overlong_buffer.len=512"],  # the first DAPO recipe's layout
])
def test_a_dapo_overlong_buffer_longer_than_the_responses_is_refused_at_load(spelling):
    """issue 35: the dapo manager refused it only when built, after the workers started."""
    with pytest.raises(ConfigError, match=r"overlong_buffer_cfg.len=512 must be in \(0, 32\] \(data.max_response_length"):
        load_config([*BASE, "data.max_response_length=32", *spelling])
    assert load_config([*BASE, "data.max_response_length=32", *spelling[:2], spelling[2].replace("512", "32")])
    with pytest.raises(ConfigError, match=r"must be in \(0, 16\] \(reward_model.reward_kwargs.max_resp_len=16\)"):
        load_config([*BASE, "data.max_response_length=32", *spelling, "+reward_model.reward_kwargs.max_resp_len=16"])
    load_config([*BASE, "data.max_response_length=32", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
                 "+reward_model.reward_kwargs.overlong_buffer_cfg.len=512"])  # not the dapo manager: not read
