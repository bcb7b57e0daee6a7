"""The checkpoint part of the N-D scenario (imported by nd_scenario.py, runs in its process group).

For a case: an engine A on the case's layout takes one AdamW step and saves its checkpoint; engines on the same
layout, on other layouts (tensor / expert parallelism switched off, the data dimension taking the ranks) and
unsharded in this process load it.  Each must hold A's parameters and Adam moments exactly, and one more step on
the same batch must take every one of them to A's parameters after that step (within 1e-5).  Rank 0 writes A's
full parameters after the first step to ``expected.pt`` so the parent can check ``hybridflow merge``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _params(module) -> dict[str, torch.Tensor]:
    return {n: _full(p) for n, p in module.named_parameters()}


def _moments(engine) -> dict[str, torch.Tensor]:
    """exp_avg of every parameter by name (full tensors)."""
    by_param = {id(p): n for n, p in engine.module.named_parameters()}
    out = {}
    for p, state in engine.optimizer.state.items():
        if "exp_avg" in state:
            out[by_param[id(p)]] = _full(state["exp_avg"])
    return out


def _diff(a: dict, b: dict) -> float:
    if set(a) != set(b):
        raise AssertionError(f"names differ: {sorted(set(a) ^ set(b))[:5]}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _step(engine, data, tokens: int, loss_fn, response_log_probs) -> None:
    mine = data.chunk(engine.dp_size)[engine.dp_rank].batch
    m = mine["response_mask"].float()
    lp, _ = response_log_probs(engine.module, dict(mine), 0.9, sequence_parallel=engine.sequence_parallel)
    loss_fn(lp, mine["advantages"], m, tokens, engine.dp_size).backward()
    engine.optimizer_step(grad_clip=1.0)


def check_checkpoint(model_dir: str, layout: dict, targets: dict[str, dict], out_dir: Path, batches, configs,
                     loss_fn) -> dict[str, float]:
    from hybridflow.engine.engine_checkpoint import load_engine_checkpoint, save_engine_checkpoint
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine

    fsdp_cfg, optim_cfg = configs(model_dir)
    world = dist.get_world_size()

    def engine_on(dims: dict | None):
        pd = ParallelDims(1) if dims is None else ParallelDims(world, **dims)
        return TrainEngine(load_causal_lm(model_dir).train(), fsdp_cfg, optim_cfg, role="actor", parallel_dims=pd)

    vocab = load_causal_lm(model_dir).config.vocab_size
    first = batches.make_update_batch(vocab, seed=11, rows=8, prompt_len=8, response_len=6)
    second = batches.make_update_batch(vocab, seed=12, rows=8, prompt_len=8, response_len=6)
    tokens1, tokens2 = (int(d.batch["response_mask"].sum()) for d in (first, second))
    a = engine_on(layout)
    _step(a, first, tokens1, loss_fn, response_log_probs)
    saved_params, saved_moments = _params(a.module), _moments(a)
    save_engine_checkpoint(a, str(out_dir), field="test")
    if dist.get_rank() == 0:
        torch.save(saved_params, out_dir / "expected.pt")
    dist.barrier()
    resumed = {name: engine_on(dims) for name, dims in targets.items()}
    result = {}
    for name, engine in resumed.items():
        load_engine_checkpoint(engine, str(out_dir), field="test")
        result[f"{name}:params"] = _diff(saved_params, _params(engine.module))
        result[f"{name}:moments"] = _diff(saved_moments, _moments(engine))
    _step(a, second, tokens2, loss_fn, response_log_probs)
    after = _params(a.module)
    result["step_size"] = max(float((after[k] - saved_params[k]).abs().max()) for k in after)
    for name, engine in resumed.items():
        _step(engine, second, tokens2, loss_fn, response_log_probs)
        result[f"{name}:next_step"] = _diff(after, _params(engine.module))
    return result
