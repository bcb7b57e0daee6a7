"""DAPO end to end: dynamic sampling refills the batch across generation rounds; overlong shaping; budget error."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run, small_overrides

A = "actor_rollout_ref"
DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"
DAPO = [
    "algorithm.adv_estimator=grpo", f"{A}.actor.clip_ratio_low=0.2", f"{A}.actor.clip_ratio_high=0.28",
    f"{A}.actor.loss_agg_mode=token-mean", "reward_model.reward_manager=dapo", "reward_model.num_workers=0",
    "+reward_model.reward_kwargs.max_resp_len=4", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=true",
    "algorithm.filter_groups.enable=true", "data.gen_batch_size=4",
]


@pytest.mark.slow
def test_dapo_dynamic_sampling_fills_batch(nano_model_dir, addition_data, tmp_path):
    extra = [DENSE_REWARD, *DAPO, "algorithm.filter_groups.metric=seq_reward",
             "algorithm.filter_groups.max_num_gen_batches=20"]
    history = run(small_overrides(nano_model_dir, addition_data, tmp_path, extra=extra), tmp_path)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert len(steps) == 2
    for m in steps:
        # gen batches of 4 prompts cannot fill 8 prompts in one round
        assert m["train/num_gen_batches"] >= 2
        assert 0 < m["train/filter_groups_kept_ratio"] <= 1
        assert "reward_extra/overlong/mean" in m  # the dapo manager's shaping info reached the batch
        assert m["critic/score/min"] < 0  # 4-token answers sit in the 2-token buffer: penalised


@pytest.mark.slow
def test_dapo_budget_exhausted_is_a_clear_error(nano_model_dir, addition_data, tmp_path):
    # Exact-match reward: a random model scores 0 everywhere, so no group ever has variance.
    extra = [*DAPO, "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=false",
             "algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.max_num_gen_batches=2"]
    extra.remove("+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true")
    with pytest.raises(RuntimeError, match="max_num_gen_batches=2"):
        run(small_overrides(nano_model_dir, addition_data, tmp_path, extra=extra), tmp_path)
