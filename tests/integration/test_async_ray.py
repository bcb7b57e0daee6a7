"""One-step-off and fully async training on Ray with CPU workers: a training process, a rollout replica process,
agent-loop worker actors, weights broadcast over gloo between the processes."""

from __future__ import annotations

import os
import signal

import pytest

from .conftest import run, small_overrides
from .test_async_training import FULLY_ASYNC, GRPO, ONE_STEP_OFF, SLOW_LOOP, _assert_same_metrics

RAY = ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.agent.num_workers=1"]
POOL = ["rollout.nnodes=1", "rollout.n_gpus_per_node=1"]

pytestmark = [pytest.mark.slow, pytest.mark.ray]



def _run(tmp_path, name, model, data, steps, extra, should_stop=None):
    out = tmp_path / name
    return run(small_overrides(model, data, out, backend="ray", steps=steps, extra=RAY + extra), out,
               should_stop=should_stop)


def _alive(ray, class_name: str) -> list[int]:
    """Process ids of the live actors of ``class_name`` (the GCS actor table; no dashboard needed)."""
    return [a["Pid"] for a in ray._private.state.actors().values()
            if a.get("ActorClassName") == class_name and a.get("State") == "ALIVE"]


def test_fully_async_with_threshold_zero_is_the_synchronous_run(ray_cluster, nano_model_dir, addition_data,
                                                                tmp_path):
    common = GRPO + ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    sync = _run(tmp_path, "sync", nano_model_dir, addition_data, 2, common)
    fully = _run(tmp_path, "fully", nano_model_dir, addition_data, 2, common + FULLY_ASYNC + POOL + [
        "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1"])
    _assert_same_metrics(sync, fully)
    assert all(m["timing_s/update_weights"] > 0 for m in fully.metrics if "timing_s/step" in m)


def test_one_step_off_on_ray(ray_cluster, nano_model_dir, addition_data, tmp_path):
    history = _run(tmp_path, "one_step_off", nano_model_dir, addition_data, 3,
                   GRPO + ONE_STEP_OFF + POOL + SLOW_LOOP + ["actor_rollout_ref.actor.optim.lr=1e-2"])
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert [m["training/staleness/max"] for m in steps] == [0, 1, 1]
    diffs = [m["training/rollout_probs_diff_mean"] for m in steps]
    assert diffs[0] < 1e-5 < min(diffs[1:])


def test_a_dying_rollout_replica_stops_the_run_by_name(ray_cluster, nano_model_dir, addition_data, tmp_path):
    """The replica's process is killed after step 2: the run stops with an error naming the replica, every
    process it started is gone, and the step-2 checkpoint is complete and resumable."""
    from hybridflow.trainer import run_checkpoint as ckpt
    from hybridflow.trainer.main_ppo import rollout_failure_types

    steps_done = []

    def kill_after_step_two() -> bool:
        steps_done.append(1)
        if len(steps_done) == 2:
            pids = _alive(ray_cluster, "RolloutServerWorker")
            assert len(pids) == 1
            os.kill(pids[0], signal.SIGKILL)
        return False

    extra = GRPO + FULLY_ASYNC + POOL + SLOW_LOOP + ["async_training.staleness_threshold=1",
                                                     "async_training.trigger_parameter_sync_step=1",
                                                     "trainer.save_freq=1"]
    with pytest.raises(rollout_failure_types()) as err:
        _run(tmp_path, "dies", nano_model_dir, addition_data, 6, extra, should_stop=kill_after_step_two)
    assert "rollout/replica0" in str(err.value)
    assert not _alive(ray_cluster, "RolloutServerWorker") and not _alive(ray_cluster, "AgentLoopWorker")
    root = tmp_path / "dies" / "ckpt"
    folder = ckpt.find_resume_dir(root, "auto", None)
    assert folder is not None and folder.name == "global_step_2"
    assert set(ckpt.read_manifest(folder)["components"]) == {"actor"}
    ledger = ckpt.load_data_state(folder)["fully_async"]
    assert ledger["frontier"] + len(ledger["beyond"]) == 2 * 4 and ledger["param_version"] == 2
