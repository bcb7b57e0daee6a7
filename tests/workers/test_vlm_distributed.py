"""A tiny Qwen2-VL on two FSDP2 ranks (gloo) against one local rank: vision blocks sharded, a rank whose
micro-batch has no image runs the vision tower anyway (no hang), the update equals the one-rank update.  And on two
pipeline stages (the tower and the first decoder layer on one, the other layer and the head on the other): the
old log-probs and the update equal the one-rank worker's."""

import importlib.util
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location("vlm_batches", Path(__file__).parents[1] / "engine" / "vlm_batches.py")
vlm_batches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vlm_batches)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _interleave(data, rows_per_rank: int):
    half = len(data) // 2
    order = []
    for start in range(0, half, rows_per_rank):
        for rank in range(2):
            order += list(range(rank * half + start, rank * half + start + rows_per_rank))
    return data.select_idxs(order)


PIPELINE = ["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2"]


@pytest.mark.parametrize("layout", ["dp", "pp"])
def test_two_rank_vlm_update_equals_one_rank(layout, tiny_vlm_dir, config_factory, tmp_path):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(tiny_vlm_dir, "data.max_prompt_length=56", "trainer.n_gpus_per_node=2",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                         *(PIPELINE if layout == "pp" else []))
    cfg.actor_rollout_ref.actor.optim.override_optimizer_config = {"eps": 1.0}
    cfg_path = tmp_path / "cfg.pkl"
    cfg_path.write_bytes(pickle.dumps(cfg))
    script = Path(__file__).with_name("two_rank_vlm_scenario.py")
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", port, str(cfg_path), str(tmp_path), layout],
                              env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    failed = [f"rank {r} failed:\n{out[-3000:]}" for r, (p, out) in enumerate(zip(procs, outputs)) if p.returncode]
    assert not failed, "\n".join(failed)
    saved = torch.load(tmp_path / "after_update.pt")

    cfg1 = config_factory(tiny_vlm_dir, "data.max_prompt_length=56",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2")
    cfg1.actor_rollout_ref.actor.optim.override_optimizer_config = {"eps": 1.0}
    worker = ActorRolloutRefWorker(cfg1.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    data = vlm_batches.make_vlm_update_batch(worker.processor, worker.actor_engine.module.config, seed=0,
                                             text_only_rows=(4, 5))
    rows = len(data) if layout == "pp" else 4  # pp: both stages took the whole batch; dp: rank 0 its half
    torch.testing.assert_close(worker.compute_log_prob(data).batch["old_log_probs"][:rows], saved["old_log_probs"],
                               rtol=1e-5, atol=1e-6)
    if layout == "dp":
        data = _interleave(data, 2)
    data = data.union(worker.compute_log_prob(data))
    metrics = worker.update_actor(data).meta_info["metrics"]
    state = worker.actor_engine.full_state_dict()
    assert set(state) == set(saved["state"])
    for k, v in state.items():
        assert torch.allclose(v, saved["state"][k], atol=1e-6, rtol=1e-5), k
    assert metrics["actor/grad_norm"] == pytest.approx(saved["metrics"]["actor/grad_norm"], rel=1e-4)
    from hybridflow.engine.model_loader import load_causal_lm

    init = load_causal_lm(tiny_vlm_dir).state_dict()
    assert sum(not torch.equal(init[k], state[k]) for k in init if ".visual." in k) > 3  # the tower trained too
