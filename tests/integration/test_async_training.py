"""Split placement, one-step-off and fully async training end to end (local backend: one process, threads).

The Ray versions of the same runs are in ``test_async_ray.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from .conftest import run, small_overrides

HERE = Path(__file__).parent
DENSE = [f"custom_reward_function.path={HERE / 'reward_fns.py'}", "custom_reward_function.name=compute_score_spread",
         "reward_model.num_workers=0"]
GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.agent.num_workers=2", "data.max_response_length=8", *DENSE]
SPLIT = ["actor_rollout_ref.hybrid_engine=false"]
ONE_STEP_OFF = SPLIT + ["async_training.mode=one_step_off"]
FULLY_ASYNC = SPLIT + ["async_training.mode=fully_async", "actor_rollout_ref.rollout.free_cache_engine=false",
                       "data.train_batch_size=0"]
SLOW_LOOP = [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={HERE / 'async_loops' / 'loops.yaml'}",
             "actor_rollout_ref.rollout.agent.default_agent_loop=slow_turns"]
COMPARED = ("critic/score/", "critic/advantages/", "response_length/", "actor/pg_loss", "actor/grad_norm",
            "actor/entropy", "actor/ppo_kl")


def _compared(history):
    return [{k: v for k, v in m.items() if k.startswith(COMPARED)} for m in history.metrics if "timing_s/step" in m]


def _assert_same_metrics(a, b):
    a, b = _compared(a), _compared(b)
    assert len(a) == len(b) > 0
    for step, (ma, mb) in enumerate(zip(a, b), 1):
        assert ma.keys() == mb.keys(), set(ma) ^ set(mb)
        assert ma["actor/grad_norm"] > 0
        for key in ma:
            assert mb[key] == pytest.approx(ma[key], rel=1e-4, abs=1e-5), (step, key)


def _runs(tmp_path, name, model, data, steps, extra, should_stop=None):
    out = tmp_path / name
    return run(small_overrides(model, data, out, backend="local", steps=steps, extra=extra), out,
               should_stop=should_stop)


@pytest.mark.slow
def test_split_placement_pushes_the_weights_every_step(nano_model_dir, addition_data, tmp_path):
    """Standalone replicas fed by the checkpoint engine sample what the colocated hybrid engine samples."""
    colocated = _runs(tmp_path, "colocated", nano_model_dir, addition_data, 3, GRPO)
    split = _runs(tmp_path, "split", nano_model_dir, addition_data, 3, GRPO + SPLIT)
    _assert_same_metrics(colocated, split)
    assert all(m["timing_s/update_weights"] > 0 for m in split.metrics if "timing_s/step" in m)
    assert not any("timing_s/update_weights" in m for m in colocated.metrics)  # the hybrid engine moves nothing


@pytest.mark.slow
def test_one_step_off_trains_exactly_one_update_behind(nano_model_dir, addition_data, tmp_path):
    """Batch k comes from the weights before update k-1: one update old (none on the first step).  With pi_old
    recomputed, the rollout's log-probs differ from it exactly from step 2 on, and rollout correction acts."""
    extra = GRPO + ONE_STEP_OFF + SLOW_LOOP + ["actor_rollout_ref.actor.optim.lr=1e-2",
                                                "algorithm.rollout_correction.rollout_is=token", "trainer.test_freq=2"]
    history = _runs(tmp_path, "one_step_off", nano_model_dir, addition_data, 4, extra)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    # validation (its own agent loops on the same replica) ran beside the batch generated ahead
    assert [m["step"] for m in steps if "val/num_samples" in m] == [2, 4]
    assert [m["training/staleness/max"] for m in steps] == [0, 1, 1, 1]
    assert [m["training/staleness/mean"] for m in steps] == [0, 1, 1, 1]
    assert {t["staleness"] for t in history.trained if t["step"] > 1} == {1}
    diffs = [m["training/rollout_probs_diff_mean"] for m in steps]
    assert diffs[0] < 1e-5 < min(diffs[1:])  # on-policy first, then one update old
    assert all("rollout_corr/rollout_is_mean" in m for m in steps)
    assert all(0.0 <= m["trainer/idle_ratio"] <= 1.0 and "timing_s/generate_async" in m for m in steps)


@pytest.mark.slow
def test_fully_async_with_threshold_zero_is_the_synchronous_run(nano_model_dir, addition_data, tmp_path):
    """staleness_threshold=0 and one sync per step: the same prompts, seeds, weights and updates as the
    synchronous trainer, so the same metrics."""
    common = GRPO + ["actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.test_freq=3"]
    sync = _runs(tmp_path, "sync", nano_model_dir, addition_data, 3, common)
    fully = _runs(tmp_path, "fully", nano_model_dir, addition_data, 3, common + FULLY_ASYNC + [
        "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1"])
    _assert_same_metrics(sync, fully)
    val = [[m[k] for k in sorted(m) if k.startswith("val-core/")] for h in (sync, fully) for m in h.metrics
           if "val/num_samples" in m]
    assert len(val) == 2 and val[0] and val[0] == pytest.approx(val[1])  # validated on the replica, same answers
    assert {t["staleness"] for t in fully.trained} == {0}
    assert [t["ordinal"] for t in fully.trained] == list(range(24))


SETTINGS = {  # staleness_threshold, trigger_parameter_sync_step, partial_rollout
    "s1_T1_partial": (1.0, 1, True),
    "s0.5_T2_partial": (0.5, 2, True),
    "s0.5_T1_wait": (0.5, 1, False),
}


@pytest.mark.slow
@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_fully_async_staleness_never_exceeds_the_bound(setting, nano_model_dir, addition_data, tmp_path):
    """Long-tail trajectories (a user agent loop whose every fourth prompt waits between its two turns) finish
    out of order and straddle weight syncs; no sample is trained more than the bound after its first token."""
    threshold, sync_every, partial = SETTINGS[setting]
    steps, batch = 6, 4
    extra = GRPO + FULLY_ASYNC + SLOW_LOOP + [
        f"async_training.staleness_threshold={threshold}", f"async_training.trigger_parameter_sync_step={sync_every}",
        f"async_training.partial_rollout={partial}"]
    history = _runs(tmp_path, setting, nano_model_dir, addition_data, steps, extra)
    per_version = batch * sync_every
    bound = math.ceil((int(per_version * (1 + threshold)) - per_version) / per_version)
    stalenesses = [t["staleness"] for t in history.trained]
    assert len(stalenesses) == steps * batch and max(stalenesses) <= bound
    assert max(stalenesses) == bound  # the rollouter did run ahead
    assert Counter(t["ordinal"] for t in history.trained) == Counter(range(steps * batch))  # each once, none lost
    for t in history.trained:
        assert t["version_start"] <= t["version_end"] and (partial or t["version_start"] == t["version_end"])
    steps_metrics = [m for m in history.metrics if "timing_s/step" in m]
    assert max(m["training/staleness/max"] for m in steps_metrics) == bound
    syncs = [m for m in steps_metrics if "rollouter/idle_ratio" in m]
    assert len(syncs) == steps // sync_every and all(0 <= m["rollouter/idle_ratio"] <= 1 for m in syncs)
    assert all("monitor/queue/mq_queue_size" in m and 0 <= m["trainer/idle_ratio"] <= 1 for m in steps_metrics)


@pytest.mark.slow
def test_fully_async_resume_trains_every_sample_exactly_once(nano_model_dir, addition_data, tmp_path):
    """A run stopped after step 3 (samples generated ahead and abandoned) and resumed trains each prompt of
    the stream exactly once; the abandoned ones are generated again."""
    extra = GRPO + FULLY_ASYNC + SLOW_LOOP + ["async_training.staleness_threshold=1",
                                              "async_training.trigger_parameter_sync_step=1", "trainer.save_freq=1"]
    steps_done = []
    first = _runs(tmp_path, "resumed", nano_model_dir, addition_data, 6, extra,
                  should_stop=lambda: steps_done.append(1) or len(steps_done) >= 3)
    second = _runs(tmp_path, "resumed", nano_model_dir, addition_data, 6, extra)
    trained_first = [t["ordinal"] for t in first.trained]
    trained_second = [t["ordinal"] for t in second.trained]
    assert len(trained_first) == 3 * 4 and len(trained_second) == 3 * 4
    assert Counter(trained_first + trained_second) == Counter(range(6 * 4))
    assert first.abandoned and set(first.abandoned) <= set(trained_second)
    assert [m["step"] for m in second.metrics if "timing_s/step" in m] == [4, 5, 6]


@pytest.mark.slow
@pytest.mark.parametrize("wal", [True, False], ids=["rollout_wal", "no_rollout_wal"])
def test_one_step_off_resume_trains_the_same_prompts(wal, nano_model_dir, addition_data, tmp_path):
    """The batch generated ahead when a one-step-off run stops is trained after the resume: the one its run generated
    (kept by the rollout log, trainer.rollout_wal), or, with the log off, one generated again from the same prompts."""
    extra = GRPO + ONE_STEP_OFF + ["trainer.save_freq=1", f"trainer.rollout_wal.enable={str(wal).lower()}"]
    straight = _runs(tmp_path, "straight", nano_model_dir, addition_data, 4, extra)
    steps_done = []
    first = _runs(tmp_path, "resumed", nano_model_dir, addition_data, 4, extra,
                  should_stop=lambda: steps_done.append(1) or len(steps_done) >= 2)
    second = _runs(tmp_path, "resumed", nano_model_dir, addition_data, 4, extra)
    assert [t["index"] for t in first.trained + second.trained] == [t["index"] for t in straight.trained]
    # with the log: the batch generated before the stop, one update behind as in the uninterrupted run; without
    # it, the first step after the resume trains a batch generated on the spot, then one update behind again
    assert [t["staleness"] for t in second.trained] == ([1] * 16 if wal else [0] * 8 + [1] * 8)
