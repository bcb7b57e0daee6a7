"""One rank of the Ulysses equality scenario (run as a script by test_sequence_parallel.py).

usage: python sp_scenario.py RANK WORLD PORT SP LM_DIR VLM_DIR OUT_JSON

Every rank loads the same tiny checkpoint twice: a plain module that computes the reference on the *whole*
batch in this process (no parallelism at all), and an FSDP2 + Ulysses engine over the group (world = dp x sp)
that computes the same thing on the rank's dp chunk, with the sequence split over its sp group.  For the actor
(log-probs + entropy of the responses, with and without gradient checkpointing), the critic (values) and a
Qwen2-VL (log-probs with images) it compares the outputs and every parameter's gradient of a loss normalised by
the global token count as the workers normalise theirs.  Rank 0 writes the max abs differences (the max over
ranks) to OUT_JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from multirank import exit_rank  # tests/ is on a scenario's path (tests/multirank.py)

HERE = Path(__file__).resolve().parent


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fsdp_config(model_dir: str):
    from hybridflow.launch.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1"])
    return cfg.actor_rollout_ref.actor.fsdp_config


def _loss(out: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, tokens: int, dp: int) -> torch.Tensor:
    """Token-sum of out x weight over the global token count, times dp (FSDP averages over the ranks)."""
    return (out * weight * mask).sum() / tokens * dp


def _grads(module) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in module.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        out[name.replace("_fsdp_wrapped_module.", "")] = g.detach().clone()
    return out


def _compare(ref_out, got_out, ref_grads, got_grads) -> dict[str, float]:
    missing = set(ref_grads) ^ set(got_grads)
    if missing:
        raise AssertionError(f"parameters with a gradient differ: {sorted(missing)[:5]}")
    out_diff = float((ref_out - got_out).abs().max())
    grad_diff = max(float((ref_grads[k] - got_grads[k]).abs().max()) for k in ref_grads)
    grad_scale = max(float(g.abs().max()) for g in ref_grads.values())
    return {"out": out_diff, "grad": grad_diff, "grad_scale": grad_scale, "params": len(ref_grads)}


def _engine(module, model_dir, sp):
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine

    dims = ParallelDims(dist.get_world_size(), sp=sp)
    return TrainEngine(module, _fsdp_config(model_dir), None, role="actor", parallel_dims=dims)


def check_actor(model_dir: str, sp: int, batches, checkpointing: bool, fused: bool = False) -> dict[str, float]:
    """``fused``: the sequence-parallel engine's LM head runs fused (engine/fused_head.py), the reference's not."""
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.fused_head import configure_fused_head
    from hybridflow.engine.model_loader import enable_gradient_checkpointing, load_causal_lm

    ref = load_causal_lm(model_dir).train()
    got = load_causal_lm(model_dir).train()  # checkpointing recomputes only in training mode
    if checkpointing:
        enable_gradient_checkpointing(got)
    configure_fused_head(got, fused, chunk_rows=5)
    engine = _engine(got, model_dir, sp)
    vocab = ref.config.vocab_size
    data = batches.make_update_batch(vocab, seed=3, rows=8, prompt_len=12, response_len=9)
    b = data.batch
    mask = b["response_mask"].float()
    tokens = int(mask.sum())
    # reference: the whole batch in one plain forward
    lp_ref, ent_ref = response_log_probs(ref, dict(b), 0.9, calculate_entropy=True, packed=False)
    (_loss(lp_ref, b["advantages"], mask, tokens, 1) - 0.01 * _loss(ent_ref, 1.0, mask, tokens, 1)).backward()
    # sequence parallel: this rank's dp chunk
    dp, dp_rank = engine.dp_size, engine.dp_rank
    mine = data.chunk(dp)[dp_rank].batch
    m = mine["response_mask"].float()
    lp, ent = response_log_probs(engine.module, dict(mine), 0.9, calculate_entropy=True,
                                 sequence_parallel=engine.sequence_parallel)
    (_loss(lp, mine["advantages"], m, tokens, dp) - 0.01 * _loss(ent, 1.0, m, tokens, dp)).backward()
    rows = slice(dp_rank * len(mine["responses"]), (dp_rank + 1) * len(mine["responses"]))
    result = _compare(lp_ref[rows] * mask[rows], lp * m, _grads(ref), _grads(engine.module))
    result["entropy"] = float(((ent_ref[rows] - ent) * m).abs().max())
    return result


def check_critic(model_dir: str, sp: int, batches) -> dict[str, float]:
    from hybridflow.engine.forward import response_values
    from hybridflow.engine.model_loader import load_value_model

    torch.manual_seed(0)
    ref = load_value_model(model_dir)
    got = load_value_model(model_dir)
    got.load_state_dict(ref.state_dict())  # the value head is freshly initialised: same weights on both
    engine = _engine(got, model_dir, sp)
    data = batches.make_update_batch(ref.config.vocab_size, seed=5, rows=8, prompt_len=10, response_len=7)
    b = data.batch
    mask = b["response_mask"].float()
    tokens = int(mask.sum())
    v_ref = response_values(ref, dict(b))
    _loss(v_ref, b["advantages"], mask, tokens, 1).backward()
    dp, dp_rank = engine.dp_size, engine.dp_rank
    mine = data.chunk(dp)[dp_rank].batch
    m = mine["response_mask"].float()
    v = response_values(engine.module, dict(mine), sequence_parallel=engine.sequence_parallel)
    _loss(v, mine["advantages"], m, tokens, dp).backward()
    rows = slice(dp_rank * len(mine["responses"]), (dp_rank + 1) * len(mine["responses"]))
    return _compare(v_ref[rows] * mask[rows], v * m, _grads(ref), _grads(engine.module))


def check_vlm(vlm_dir: str, sp: int) -> dict[str, float]:
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm, load_processor

    vlm_batches = _load("hf_test_vlm_batches", "vlm_batches.py")
    processor = load_processor(vlm_dir)
    ref = load_causal_lm(vlm_dir)
    got = load_causal_lm(vlm_dir)
    engine = _engine(got, vlm_dir, sp)
    data = vlm_batches.make_vlm_update_batch(processor, ref.config, seed=2, rows=4)
    b = data.batch
    mm = data.non_tensor_batch["multi_modal_inputs"]
    mask = b["response_mask"].float()
    tokens = int(mask.sum())
    lp_ref, _ = response_log_probs(ref, dict(b), 0.9, packed=False, multi_modal_inputs=mm)
    _loss(lp_ref, b["advantages"], mask, tokens, 1).backward()
    dp, dp_rank = engine.dp_size, engine.dp_rank
    chunk = data.chunk(dp)[dp_rank]
    mine = chunk.batch
    m = mine["response_mask"].float()
    lp, _ = response_log_probs(engine.module, dict(mine), 0.9, multi_modal_inputs=chunk.non_tensor_batch["multi_modal_inputs"],
                               sequence_parallel=engine.sequence_parallel)
    _loss(lp, mine["advantages"], m, tokens, dp).backward()
    rows = slice(dp_rank * len(mine["responses"]), (dp_rank + 1) * len(mine["responses"]))
    return _compare(lp_ref[rows] * mask[rows], lp * m, _grads(ref), _grads(engine.module))


def _max_over_ranks(result: dict[str, float]) -> dict[str, float]:
    keys = sorted(result)
    t = torch.tensor([float(result[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.tolist()))


def main(rank: int, world: int, port: int, sp: int, lm_dir: str, vlm_dir: str, out_json: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=240))
    batches = _load("hf_test_batches", "batches.py")
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.ulysses import COMM

    engine = _engine(load_causal_lm(lm_dir), lm_dir, sp)
    # the loss normalisers are summed over the dp group only: sp peers hold the same rows
    layout = {"dp": engine.dp_size, "dp_sum_of_ones": engine.all_reduce_sum([1.0])[0], "dp_rank": engine.dp_rank,
              "sp_rank": engine.sequence_parallel.rank}
    checks = {
        "actor": lambda: check_actor(lm_dir, sp, batches, checkpointing=False),
        "actor_checkpointing": lambda: check_actor(lm_dir, sp, batches, checkpointing=True),
        "actor_fused_head": lambda: check_actor(lm_dir, sp, batches, checkpointing=False, fused=True),
        "critic": lambda: check_critic(lm_dir, sp, batches),
        "vlm": lambda: check_vlm(vlm_dir, sp),
    }
    results = {}
    for name, check in checks.items():
        COMM.reset()
        results[name] = check()
        results[name]["comm_bytes"] = COMM.sent.get("all_to_all", 0.0)
    results = {k: _max_over_ranks(v) for k, v in results.items()}
    results["layout"] = [None] * world
    dist.all_gather_object(results["layout"], layout)
    if rank == 0:
        Path(out_json).write_text(json.dumps({"world": world, "sp": sp, "results": results}, indent=1))
    exit_rank()  # barrier, destroy, and an exit that skips interpreter finalisation (tests/multirank.py)


if __name__ == "__main__":
    r, w, port, sp = (int(x) for x in sys.argv[1:5])
    main(r, w, port, sp, sys.argv[5], sys.argv[6], sys.argv[7])
