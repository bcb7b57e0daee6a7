"""Rollout threads and agent-loop workers sized by the trajectories a run can have in flight (golden values)."""

from __future__ import annotations

import pytest

from hybridflow.agents.loop_manager import agent_worker_count, concurrent_trajectories, rollout_stream_threads
from hybridflow.launch.config import load_config

A = "actor_rollout_ref"
BASE = [f"{A}.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
        "data.train_batch_size=8", f"{A}.actor.ppo_mini_batch_size=8", f"{A}.rollout.n=4"]


@pytest.mark.parametrize("extra,trajectories,threads", [
    ([], 32, 32),                                                          # 8 prompts x n=4
    ([f"{A}.rollout.max_num_seqs=16"], 32, 16),                            # no more than the engine runs at once
    (["data.gen_batch_size=24"], 96, 96),                                  # DAPO: a generation round's prompts
    (["data.val_batch_size=64", f"{A}.rollout.val_kwargs.n=2"], 128, 128),  # validation is the larger
    (["data.val_batch_size=64", "data.val_files=null"], 32, 32),           # ... when there is validation
    (["data.train_batch_size=512", f"{A}.actor.ppo_mini_batch_size=512"], 2048, 1024),  # max_num_seqs default
])
def test_threads_follow_the_trajectories_in_flight(extra, trajectories, threads):
    cfg = load_config([*BASE, *extra])
    assert concurrent_trajectories(cfg) == trajectories
    assert rollout_stream_threads(cfg) == threads


def test_fully_async_counts_the_rollouters_budget():
    import sys
    from pathlib import Path

    folder = str(Path(__file__).parents[1] / "config")
    sys.path.insert(0, folder)
    try:
        from test_async_config import VERL_FULLY_ASYNC  # verl's own fully async command line
    finally:
        sys.path.remove(folder)

    cfg = load_config(VERL_FULLY_ASYNC, config_name="fully_async_ppo_trainer")
    # (1 + staleness_threshold 0.1) x trigger_parameter_sync_step 4 x 128 prompts per step (require_batches 4 x
    # ppo_mini_batch_size 32), x rollout.n=16
    assert concurrent_trajectories(cfg) == int(128 * 4 * 1.1) * 16
    assert rollout_stream_threads(cfg) == 1024


def test_agent_workers_never_outnumber_the_trajectories():
    assert agent_worker_count(None, "local", trajectories=1) == 1
    assert agent_worker_count(3, "local", trajectories=1) == 3  # a configured count is kept


def test_agent_workers_scale_with_the_trajectories_in_flight(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert agent_worker_count(None, "local", trajectories=32) == 1  # a small run: one worker
    assert agent_worker_count(None, "local", trajectories=257) == 2
    assert agent_worker_count(None, "local", trajectories=1024 * 8) == 8  # verl's 8 at scale
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert agent_worker_count(None, "local", trajectories=1024 * 8) == 2  # never more than the CPUs
