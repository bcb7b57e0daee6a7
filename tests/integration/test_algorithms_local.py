"""Each algorithm's example settings train a few real steps in-process (local backend, tiny model)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from .conftest import run, small_overrides

A = "actor_rollout_ref"
DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"

ALGORITHMS = {
    "gae": ["algorithm.adv_estimator=gae", "trainer.critic_warmup=1"],
    "grpo": ["algorithm.adv_estimator=grpo", f"{A}.actor.use_kl_loss=true", f"{A}.actor.kl_loss_type=low_var_kl"],
    "rloo": ["algorithm.adv_estimator=rloo", "algorithm.use_kl_in_reward=true"],
    "reinforce_plus_plus": ["algorithm.adv_estimator=reinforce_plus_plus", f"{A}.actor.use_kl_loss=true"],
    "remax": ["algorithm.adv_estimator=remax", "algorithm.use_kl_in_reward=true"],
    "drgrpo": ["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false",
               f"{A}.actor.loss_agg_mode=seq-mean-token-sum-norm"],
    "gspo": ["algorithm.adv_estimator=grpo", f"{A}.actor.policy_loss.loss_mode=gspo",
             f"{A}.actor.loss_agg_mode=seq-mean-token-mean", f"{A}.actor.clip_ratio_low=0.0003",
             f"{A}.actor.clip_ratio_high=0.0004"],
    "optimal_token_baseline": ["algorithm.adv_estimator=optimal_token_baseline",
                               f"{A}.actor.calculate_sum_pi_squared=true"],
    "grpo_rollout_correction": ["algorithm.adv_estimator=grpo", f"{A}.rollout.calculate_log_probs=true",
                                "algorithm.rollout_correction.rollout_is=token",
                                "algorithm.rollout_correction.rollout_rs=token",
                                "algorithm.rollout_correction.rollout_rs_threshold=2.0"],
    # verl 0.9: GDPO over the reward function's two dict entries, DPPO's TV trust region, IcePop IS bounds with two
    # rejection criteria at once
    "gdpo": ["algorithm.adv_estimator=gdpo", "+algorithm.gdpo_reward_keys=[score,acc]",
             "reward.reward_manager.name=gdpo"],
    "dppo_tv": ["algorithm.adv_estimator=grpo", f"{A}.actor.policy_loss.loss_mode=dppo_tv",
                f"{A}.actor.clip_ratio_low=0.15", f"{A}.actor.clip_ratio_high=0.15", f"{A}.actor.clip_ratio_c=10000.0"],
    "grpo_rollout_correction_verl09": ["algorithm.adv_estimator=grpo", f"{A}.rollout.calculate_log_probs=true",
                                       "algorithm.rollout_correction.rollout_is=token",
                                       "algorithm.rollout_correction.rollout_is_threshold=0.5_4.0",
                                       "algorithm.rollout_correction.rollout_rs='token_k1,seq_max_k2'",
                                       "algorithm.rollout_correction.rollout_rs_threshold='0.6_1.6,2.5'"],
    "grpo_bypass_reinforce": ["algorithm.adv_estimator=grpo", f"{A}.rollout.calculate_log_probs=true",
                              "algorithm.rollout_correction.bypass_mode=true",
                              "algorithm.rollout_correction.loss_type=reinforce",
                              "algorithm.rollout_correction.rollout_is=token"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_algorithm_trains_two_steps(name, nano_model_dir, addition_data, tmp_path):
    extra = [DENSE_REWARD, "reward_model.num_workers=0", *ALGORITHMS[name], "trainer.test_freq=2",
             f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", f"trainer.validation_data_dir={tmp_path / 'val'}"]
    history = run(small_overrides(nano_model_dir, addition_data, tmp_path, extra=extra), tmp_path)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps[1:] if name == "gae" else steps:
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0
        assert m["response_length/mean"] > 0
        assert m["perf/throughput"] > 0 and "perf/cpu_memory_used_gb" in m
        if "actor/pg_loss" in m:
            assert 0.0 < m["perf/mfu/actor"] < 1.0
        assert 0.0 <= m["critic/score/mean"] <= 1.0
    if name == "gae":
        assert "actor/pg_loss" not in steps[0]  # critic warm-up: step 1 trains the critic only
        assert all("critic/vf_loss" in m and "timing_s/values" in m for m in steps)
        steps = steps[1:]
    if name == "remax":
        assert steps[0]["timing_s/gen_max"] > 0
    if "algorithm.use_kl_in_reward=true" in ALGORITHMS[name]:
        assert "actor/reward_kl_penalty" in steps[0] and "timing_s/ref" in steps[0]
    if name == "grpo":
        assert "actor/kl_loss" in steps[0] and "timing_s/ref" in steps[0]
    if name == "optimal_token_baseline":
        assert "timing_s/old_log_prob" in steps[0]  # its advantages read pi_old and sum_pi_squared
    if name == "grpo_rollout_correction":
        # the hf rollout samples with the actor's own module, so pi_old / mu is 1 up to float noise
        assert "timing_s/old_log_prob" in steps[0]
        assert abs(steps[0]["rollout_corr/rollout_is_mean"] - 1.0) < 1e-3
        assert steps[0]["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    if name == "grpo_rollout_correction_verl09":
        assert steps[0]["rollout_corr/rollout_is_oob_ratio"] == 0.0  # mu = pi_old up to float noise: nothing zeroed
        for option in ("token_k1", "seq_max_k2"):
            assert steps[0][f"rollout_corr/rollout_rs_{option}_masked_fraction"] == 0.0
    if name == "gdpo":
        assert "reward_extra/acc/mean" in steps[0] and steps[0]["critic/advantages/max"] > 0  # the dict reached it
    if name == "dppo_tv":
        assert 0.0 <= steps[0]["actor/pg_clipfrac"] <= 1.0
    if name == "grpo_bypass_reinforce":
        # the rollout's log-probs are pi_old: no old_log_prob pass; the loss weighs by pi_theta / mu, which is 1 on
        # the first of the two mini-batches and moves after the first optimiser step (it used to be exactly 1)
        assert "timing_s/old_log_prob" not in steps[0]
        assert steps[0]["rollout_corr/rollout_is_mean"] != 1.0
        assert abs(steps[0]["rollout_corr/rollout_is_mean"] - 1.0) < 0.5
        assert "actor/entropy" in steps[0] and "training/rollout_probs_diff_mean" in steps[0]
    if name == "drgrpo":
        assert "timing_s/ref" not in steps[0]  # no KL anywhere: the reference stage is skipped
    assert (tmp_path / "metrics.jsonl").is_file()
    dumped = (tmp_path / "rollouts" / "2.jsonl").read_text().splitlines()
    assert len(dumped) == 8 * 4 and {"input", "output", "score", "step", "acc"} <= json.loads(dumped[0]).keys()
    assert (tmp_path / "val" / "2.jsonl").is_file()
    assert 0.0 <= steps[-1]["val-core/synthetic/addition/acc/mean@1"] <= 1.0
