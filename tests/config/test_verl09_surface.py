"""verl 0.9 keys that the example scripts use and that act here: each one's config-time acceptance and its refusals
(the formulas are tested in tests/algorithms/, the runs in tests/integration/test_algorithms_local.py)."""

from __future__ import annotations

import warnings

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config

A = "actor_rollout_ref"
BASE = [f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4", f"{A}.rollout.n=4"]
RC = "algorithm.rollout_correction"


def load(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([*BASE, *overrides])


def test_gdpo_keys_load_and_are_checked():
    cfg = load("algorithm.adv_estimator=gdpo", '+algorithm.gdpo_reward_keys=["accuracy_reward", "format_reward"]',
               "reward.reward_manager.name=gdpo", "algorithm.gdpo_reward_weights=[1.0,0.5]")
    assert cfg.algorithm.gdpo_reward_keys == ["accuracy_reward", "format_reward"]
    assert cfg.reward_model.reward_manager == "gdpo"
    with pytest.raises(ConfigError, match=r"adv_estimator=gdpo normalises each reward component apart: set "
                                          r"algorithm.gdpo_reward_keys"):
        load("algorithm.adv_estimator=gdpo")
    with pytest.raises(ConfigError, match=r"gdpo_reward_weights has 1 entries for the 2"):
        load("algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1]")
    with pytest.raises(ConfigError, match=r"read by algorithm.adv_estimator=gdpo only \(this run uses grpo\)"):
        load("algorithm.adv_estimator=grpo", "algorithm.gdpo_reward_keys=[a]")


@pytest.mark.parametrize("overrides", [
    [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_4.0"],
    [f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.6_1.6"],
    [f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.6_1.6,2.5'"],
    [f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.01"],
])
def test_verl09_rollout_correction_thresholds_load(overrides):
    cfg = load(f"{A}.rollout.calculate_log_probs=true", *overrides)
    assert cfg.algorithm.rollout_correction is not None


@pytest.mark.parametrize("overrides,message", [
    ([f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.6_1.6,2.5,1'"],
     r"rollout_rs_threshold='0.6_1.6,2.5,1' gives 3 thresholds for the 2 criteria"),
    ([f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=0.5_2.0"], r"seq_max_k2 takes one upper bound"),
    ([f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=4.0_0.5"], r"rollout_is_threshold='4.0_0.5': the lower"),
    ([f"{RC}.rollout_rs=token_k4", f"{RC}.rollout_rs_threshold=2"], r"unknown criterion 'token_k4'"),
    ([f"{RC}.rollout_rs_threshold=0.6_1.6"], r"rollout_rs_threshold='0.6_1.6' bounds the rejection criteria .* null"),
])
def test_bad_rollout_correction_thresholds_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load(f"{A}.rollout.calculate_log_probs=true", *overrides)


def test_dppo_loss_modes_load():
    for mode in ("dppo_tv", "dppo_kl"):
        assert load(f"{A}.actor.policy_loss.loss_mode={mode}").actor_rollout_ref.actor.policy_loss.loss_mode == mode
