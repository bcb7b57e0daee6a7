"""GRPO (2 steps) and PPO with GAE (2 steps, critic) on Ray with 2 CPU workers and Ulysses sequence parallelism 2
(actor, reference, critic: dp = 1, every sequence split over both ranks) give the metrics of the local backend.

As in test_ray_vs_local.py, sampling is greedy so the comparison is about the training path: here the N-D
dispatch (the whole batch to both ranks of the sp group, outputs collected from one), the packed forward split
over the ranks with all-to-all attention, the gathered log-probs / values and the gradients.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run, small_overrides

DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"
COMPARED = ("critic/score/", "critic/advantages/", "critic/returns/", "critic/values/", "response_length/",
            "actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/kl_loss")
A = "actor_rollout_ref"
SP = [f"{A}.actor.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2"]
SETTINGS = {
    "grpo": ["algorithm.adv_estimator=grpo", f"{A}.rollout.n=1", "custom_reward_function.name=compute_score_spread",
             f"{A}.actor.ppo_mini_batch_size=8", f"{A}.actor.ppo_micro_batch_size_per_gpu=4",
             f"{A}.actor.use_kl_loss=true", f"{A}.actor.kl_loss_coef=0.1"],
    "gae": ["algorithm.adv_estimator=gae", f"{A}.actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8",
            "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=64", "critic.forward_max_token_len_per_gpu=64"],
}



def _steps(history):
    return [m for m in history.metrics if "timing_s/step" in m]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("algo", sorted(SETTINGS))
def test_sp2_on_ray_matches_local(algo, ray_cluster, nano_model_dir, addition_data, tmp_path):
    extra = [DENSE_REWARD, "reward_model.num_workers=0", f"{A}.rollout.do_sample=false", "trainer.balance_batch=false",
             "critic.model.use_remove_padding=true", *SETTINGS[algo]]
    local = run(small_overrides(nano_model_dir, addition_data, tmp_path / "local", backend="local", extra=extra),
                tmp_path / "local")
    remote = run(small_overrides(nano_model_dir, addition_data, tmp_path / "ray", backend="ray", extra=[*extra, *SP]),
                 tmp_path / "ray")
    a, b = _steps(local), _steps(remote)
    assert len(a) == len(b) == 2
    for ma, mb in zip(a, b):
        assert mb["perf/actor_sp_comm_mb"] > 0  # the update ran sequence-parallel (all-to-alls were sent)
        if algo == "gae":
            assert mb["perf/critic_sp_comm_mb"] > 0
        keys = [k for k in ma if k.startswith(COMPARED)]
        assert keys and ma["actor/grad_norm"] > 0
        for key in keys:
            assert mb[key] == pytest.approx(ma[key], rel=1e-4, abs=1e-5), key
