"""What a small Ray run holds: OS threads sized by the step's demand (not by ``rollout.max_num_seqs``), and
failure counts that cross process boundaries (agent-loop workers and the reward-loop scorer are Ray actors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.agents.loop_manager import rollout_stream_threads

from .conftest import run, small_overrides

FAULTS = Path(__file__).parents[1] / "faults"



def _threads() -> dict[str, int]:
    """OS threads of this process and of every process it started (Ray's GCS, raylet, workers, actors)."""
    import psutil

    me = psutil.Process()
    counts = {"driver": me.num_threads()}
    for child in me.children(recursive=True):
        try:
            counts[f"{child.name()}[{child.pid}]"] = child.num_threads()
        except psutil.NoSuchProcess:
            pass
    return counts


@pytest.mark.slow
@pytest.mark.ray
def test_a_small_ray_run_holds_threads_by_demand_and_counts_failures(ray_cluster, nano_model_dir, addition_data,
                                                                     tmp_path):
    from hybridflow.launch.config import load_config

    extra = ["trainer.n_gpus_per_node=1", "algorithm.adv_estimator=grpo", "data.val_files=null", "data.shuffle=false",
             "actor_rollout_ref.rollout.agent.num_workers=2",
             f"actor_rollout_ref.rollout.agent.agent_loop_config_path={FAULTS / 'faulty_loops.yaml'}",
             "actor_rollout_ref.rollout.agent.default_agent_loop=raises_on_some_prompts",
             f"custom_reward_function.path={FAULTS / 'faulty_rewards.py'}",
             "custom_reward_function.name=raises_on_some_prompts"]
    overrides = small_overrides(nano_model_dir, addition_data, tmp_path, backend="ray", steps=2, n=2, batch=8,
                                extra=extra)
    assert rollout_stream_threads(load_config(overrides)) == 16  # 8 prompts x n=2, below max_num_seqs=1024
    seen: list[dict[str, int]] = []
    history = run(overrides, tmp_path, should_stop=lambda: seen.append(_threads()) or False)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    # prompts 0 and 4 of each 8 fail in the agent loop (2 x n=2 of 16 trajectories) and in the reward function
    # (their empty stand-ins are still scored): both counted from rows that crossed from Ray actors
    assert [s["rollout/failed_fraction"] for s in steps] == [0.25, 0.25]
    assert [s["agent/error_count"] for s in steps] == [4.0, 4.0]
    assert [s["reward/error_fraction"] for s in steps] == [0.25, 0.25]
    worker = max(v for k, v in seen[-1].items() if k.startswith("ray::ColocatedWorker"))
    total = sum(seen[-1].values())
    # Ray's own threads are ~40 per process; the rollout group adds 16 here (it added 1,024 before: ~1,050 in all)
    print("threads at the end of step 2:", seen[-1])
    assert worker <= 16 + 64, seen[-1]
    assert total <= 500, seen[-1]
