"""Padding never enters the loss (issue 15, item 3).

DP_COMPUTE_PROTO pads a batch whose length does not divide the data-parallel ranks with copies of real rows.
Those copies now carry ``response_mask = 0`` and do not add optimiser steps, so an uneven batch trained on two
ranks gives the same weights as the same batch on one rank -- for the actor and the critic.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hybridflow.controller.decorator import Dispatch, get_dispatch_mode
from hybridflow.protocol import DataProto

A = "actor_rollout_ref"
ROWS = 5  # over 2 ranks: padded to 6, the last rank holds rows 3, 4 and a copy of row 0


def _split(data: DataProto, world: int) -> list[DataProto]:
    return get_dispatch_mode(Dispatch.DP_COMPUTE_PROTO).plan(SimpleNamespace(world_size=world), data).args[0]


def test_dispatch_padding_is_masked_and_counted():
    data = DataProto.from_dict({"response_mask": torch.ones(ROWS, 3, dtype=torch.long),
                                "x": torch.arange(ROWS).unsqueeze(1)})
    parts = _split(data, 2)
    assert [len(p) for p in parts] == [3, 3]
    assert parts[1].batch["x"][:, 0].tolist() == [3, 4, 0]  # a copy of row 0 fills the last slot ...
    assert parts[1].batch["response_mask"][2].sum() == 0  # ... and cannot train
    assert parts[0].batch["response_mask"].sum() == 9 and parts[1].batch["response_mask"][:2].sum() == 6
    assert data.batch["response_mask"].sum() == ROWS * 3  # the caller's batch is untouched


@pytest.mark.parametrize("rows,ranks,mini", [(5, 2, 1), (5, 2, 2), (7, 4, 1), (9, 4, 2), (13, 4, 3)])
def test_padding_adds_no_optimiser_step(rows, ranks, mini):
    """A rank's mini-batches (``mini`` rows each) over its padded share: as many as the unpadded batch has."""
    share = len(_split(DataProto.from_dict({"x": torch.zeros(rows, 1)}), ranks)[0])
    assert len(range(0, share, mini)) == -(-rows // (ranks * mini))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(vocab: int, batches) -> DataProto:
    data = batches.make_update_batch(vocab, seed=11, rows=ROWS)
    g = torch.Generator().manual_seed(12)
    mask = data.batch["response_mask"].float()
    data.batch["old_log_probs"] = -torch.rand(mask.shape, generator=g) * mask
    data.batch["values"] = torch.randn(mask.shape, generator=g) * mask
    data.batch["returns"] = torch.randn(mask.shape, generator=g) * mask
    return data


@pytest.mark.slow
def test_uneven_batch_on_two_ranks_equals_one_rank(tiny_model_dir, config_factory, batches, tmp_path):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker
    from hybridflow.workers.critic import CriticWorker

    cfg = config_factory(
        tiny_model_dir, f"{A}.rollout.n=1", "data.train_batch_size=6", f"{A}.actor.ppo_mini_batch_size=6",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
        "algorithm.adv_estimator=gae", "critic.model.enable_gradient_checkpointing=false",
    )
    for optim in (cfg.actor_rollout_ref.actor.optim, cfg.critic.optim):
        optim.override_optimizer_config = {"eps": 1.0}  # Adam's first step ~ linear in the gradient
    actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout")
    actor.init_model()
    data = _batch(actor.actor_engine.module.config.vocab_size, batches)
    job = {"config": cfg, "actor_chunks": _split(data, 2), "critic_chunks": _split(data, 2)}
    (tmp_path / "job.pkl").write_bytes(pickle.dumps(job))
    script = Path(__file__).with_name("uneven_batch_scenario.py")
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", port, str(tmp_path / "job.pkl"),
                               str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out[-4000:]}"
    two = torch.load(tmp_path / "two_ranks.pt")

    critic = CriticWorker(cfg.critic)
    critic.init_model(total_training_steps=1)
    init = {"actor": actor.actor_engine.full_state_dict(), "critic": critic.engine.full_state_dict()}
    one_actor_metrics = actor.update_actor(data).meta_info["metrics"]
    critic.update_critic(data)
    for name, state in (("actor", actor.actor_engine.full_state_dict()), ("critic", critic.engine.full_state_dict())):
        assert state.keys() == two[name].keys()
        moved = 0
        for key, value in state.items():  # compare the updates, not the (much larger) weights
            delta_one, delta_two = value - init[name][key], two[name][key] - init[name][key]
            # a weight of ~0.02 holds a delta of ~1e-6 only to its own rounding (1 ulp ~ 1.9e-9): allow 2 ulps;
            # 1e-10 absolute for tensors whose true gradient is 0 (k_proj.bias: deltas are reduction noise)
            ulps = 2 * torch.finfo(value.dtype).eps * value.abs()
            bad = (delta_one - delta_two).abs() > 1e-3 * delta_one.abs() + ulps + 1e-10
            assert not bool(bad.any()), (name, key, (delta_one - delta_two)[bad][:5], delta_one[bad][:5])
            moved += int(delta_one.abs().max() > 0)
        assert moved > 5, name  # the update did move the weights: equality is not trivial
    assert len(one_actor_metrics["actor/grad_norm"]) == 1 == len(two["actor_metrics"]["actor/grad_norm"])
    assert one_actor_metrics["actor/grad_norm"][0] == pytest.approx(two["actor_metrics"]["actor/grad_norm"][0], rel=1e-4)
    assert len(two["critic_metrics"]["critic/grad_norm"]) == 1
