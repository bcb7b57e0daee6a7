"""GRPO and PPO (with critic) on Ray with 2 CPU worker processes give the same metrics as the local backend.

The worker losses are normalised by global token counts, so two ranks of half the batch accumulate the
same gradient as one rank of all of it (up to float summation order).  Sampling is greedy here: each rank
owns its own sampling stream, so sampled responses legitimately differ between 1 and 2 ranks; greedy
decoding makes the comparison about the training path (dispatch, gradients, all-reduce, collect).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run, small_overrides

DENSE_REWARD = f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}"
COMPARED = ("critic/score/", "critic/rewards/", "critic/advantages/", "critic/returns/", "critic/values/",
            "response_length/", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/vf_loss",
            "critic/grad_norm", "actor/kl_loss")



def _compared(history):
    steps = [m for m in history.metrics if "timing_s/step" in m]
    return [{k: v for k, v in m.items() if k.startswith(COMPARED)} for m in steps]


# One mini-batch per step: each rank then updates on exactly its share of the same global batch.  GRPO uses
# n=1 (a singleton group's advantage is its score): with greedy decoding n>1 samples would be identical and
# every GRPO advantage zero, which would make the comparison vacuous.
SETTINGS = {
    "grpo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1", "custom_reward_function.name=compute_score_spread",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
    "gae": ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "critic.ppo_mini_batch_size=8"],
}


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("algo", sorted(SETTINGS))
def test_ray_two_workers_match_local(algo, ray_cluster, nano_model_dir, addition_data, tmp_path):
    extra = [DENSE_REWARD, "reward_model.num_workers=0", "actor_rollout_ref.rollout.do_sample=false",
             "trainer.balance_batch=false", *SETTINGS[algo]]
    local = run(small_overrides(nano_model_dir, addition_data, tmp_path / "local", backend="local", extra=extra),
                tmp_path / "local")
    timeline = tmp_path / "timeline.json"  # ray_kwargs.timeline_json_file: Ray's task timeline of the run
    remote = run(small_overrides(nano_model_dir, addition_data, tmp_path / "ray", backend="ray",
                                 extra=[*extra, f"ray_kwargs.timeline_json_file={timeline}"]), tmp_path / "ray")
    assert timeline.is_file() and timeline.read_text().lstrip().startswith("[")
    a, b = _compared(local), _compared(remote)
    assert len(a) == len(b) == 2
    for ma, mb in zip(a, b):
        assert ma.keys() == mb.keys(), set(ma) ^ set(mb)
        assert ma["actor/grad_norm"] > 0
        for key in ma:
            assert mb[key] == pytest.approx(ma[key], rel=1e-4, abs=1e-5), key
