"""GRPO on a real two-node Ray cluster started with the ``ray`` CLI, token authentication on, the driver attached
through ``ray_kwargs.ray_init.address``.

The cluster (``tests/ray_cli_cluster.py``): ``ray start --head`` and ``ray start --address=HEAD``, each with
1 CPU and a custom resource of its own (``hf_head`` / ``hf_worker``), so a ``trainer.nnodes=2
trainer.n_gpus_per_node=1`` run can only fit one rank per node.  The driver is a separate ``hybridflow train``
process that *attaches*: given an address, ``ray.init`` starts no GCS and no raylet, so neither node belongs to
the driver -- both were started by ``ray start`` and outlive it.  Checked: the cluster still has exactly the two
nodes it was started with after the run, the ranks ran on both (the node ids the run reports are those two), a
driver without the token is refused, and stopping the cluster leaves none of its processes behind.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ray_cli_cluster import RayCliCluster

pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

A = "actor_rollout_ref"


@pytest.fixture(scope="module")
def cluster():
    c = RayCliCluster(num_cpus=1)
    try:
        c.start()
        yield c
    finally:
        leftovers = c.stop()
        assert not leftovers, f"processes of the cluster survived its ray start processes: {leftovers}"


def test_a_driver_without_the_token_is_refused(cluster):
    with pytest.raises(RuntimeError, match="probe failed"):
        cluster.probe(token=False, timeout_s=120)


def test_grpo_runs_over_both_nodes_through_ray_init_address(cluster, nano_model_dir, tmp_path):
    from hybridflow.data.synthetic import write_synthetic

    before = cluster.probe()
    nodes = {n["id"]: n for n in before["nodes"] if n["alive"]}
    assert len(nodes) == 2
    write_synthetic("addition", str(tmp_path / "data"), train_size=16, test_size=4, seed=0)
    reward = Path(__file__).parents[1] / "integration" / "reward_fns.py"
    overrides = [
        f"{A}.model.path={nano_model_dir}", f"data.train_files={tmp_path / 'data' / 'train.parquet'}",
        f"data.val_files={tmp_path / 'data' / 'test.parquet'}", "data.train_batch_size=4",
        "data.max_prompt_length=32", "data.max_response_length=4", "algorithm.adv_estimator=grpo",
        f"{A}.rollout.name=hf", f"{A}.rollout.n=2", f"{A}.actor.ppo_mini_batch_size=4",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=2", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"{A}.model.enable_gradient_checkpointing=false", f"custom_reward_function.path={reward}",
        "custom_reward_function.name=compute_score_spread", "reward_model.num_workers=0",
        "trainer.backend=ray", "trainer.device=cpu", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=[console,file]", "trainer.report=false",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.project_name=mn", "trainer.experiment_name=run",
        f"+ray_kwargs.ray_init.address={cluster.address}",  # verl's grammar: the key is not in the defaults
    ]
    run = subprocess.run([sys.executable, "-m", "hybridflow", "train", *overrides], cwd=tmp_path,
                         env=cluster.env(), capture_output=True, text=True, timeout=600)
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"the run failed ({run.returncode}):\n{log[-6000:]}"
    placed = re.search(r"hybridflow: (\S+) ranks: rank 0 on node (\w+) \(([^)]*)\), rank 1 on node (\w+)", log)
    assert placed, f"the run did not say where its ranks went:\n{log[-4000:]}"
    ranks = [placed.group(2), placed.group(4)]
    short = {node_id[:8]: node_id for node_id in nodes}
    assert sorted(ranks) == sorted(short), f"ranks on {ranks}, the cluster's nodes are {sorted(short)}"
    resources = [set(nodes[short[r]]["resources"]) & {"hf_head", "hf_worker"} for r in ranks]
    assert resources[0] | resources[1] == {"hf_head", "hf_worker"}, "both ranks on one node"
    print(f"\n{placed.group(0)} -- nodes: " + ", ".join(f"{r} = {sorted(res)[0]}" for r, res in zip(ranks, resources)))
    metrics = [json.loads(line) for path in tmp_path.rglob("*.jsonl") for line in path.read_text().splitlines()
               if line.strip()]
    trained = [m for m in metrics if "actor/pg_loss" in m]
    assert trained and trained[-1]["actor/grad_norm"] > 0, f"no trained step in the metrics: {metrics[-1:]}"
    after = cluster.probe()  # the driver is gone; the cluster it attached to is the same two nodes
    assert {n["id"] for n in after["nodes"] if n["alive"]} == set(nodes)
    assert len(after["nodes"]) == 2, "the driver added a node of its own"
