"""GPU check: tensor and expert parallelism (``strategy=megatron``) on a Qwen2.5-0.5B-shaped dense model and a
Qwen3-MoE-shaped model, built from config with random weights (bf16 compute), on 2 or 4 GPUs.

NOT RUN YET on a GPU: written in a session that had none.  ``--cpu-smoke`` runs the same code path on CPU (gloo,
nano shapes, 2 processes, 2 steps), which is how it was checked.  On a GPU machine put the printed rows, dated, in
benchmarks/RESULTS.md (section "GPU checks").

For each layout it starts one process per GPU (NCCL), builds the actor as the trainer does (``TrainEngine`` on
``ParallelDims(world, tp=, ep=)``: DTensor TP / all-to-all EP, FSDP2 over the rest) and runs ``--steps`` policy
updates on a synthetic rollout batch (``--rows`` x ``--tokens``): response log-probs on vocabulary shards, a
token-mean policy-gradient loss, backward, clipped AdamW.  Reported (max over ranks, median over the steps after
the first): step seconds, tokens/s/GPU, peak GPU memory (``max_memory_allocated``), the all-to-all bytes of the
experts, and the rollout transition into a plain bf16 copy both ways -- bucketed (``engine/reshard.py``) and a full
state dict -- with its seconds and peak-memory rise.

    python benchmarks/gpu/bench_tp_ep.py                       # dense tp2, MoE ep2 (2 GPUs)
    python benchmarks/gpu/bench_tp_ep.py --layouts dp2xtp2,ep2xtp2,ep4xtp2   # 4 GPUs
    python benchmarks/gpu/bench_tp_ep.py --cpu-smoke           # CPU, nano shapes: the code path only
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the dense model: Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 / 2 heads) with its 151,936-token vocabulary;
# the MoE model: a ~0.4B Qwen3-MoE (8 layers x 32 experts of 512, 16 / 4 heads)
SHAPES = {
    "dense": dict(family=None, size="qwen2.5-0.5b", vocab_size=151936),
    "moe": dict(family="qwen3-moe", size=None, vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=32,
                num_experts_per_tok=4, moe_intermediate_size=512),
}
# name -> (world, tp, ep, model)
# ep4xtp2: expert groups over dp x tp (ep does not divide dp = 2), the shape of verl's Qwen3-30B tp 2 / ep 8 line
LAYOUTS = {"tp2": (2, 2, 1, "dense"), "ep2": (2, 1, 2, "moe"), "dp2xtp2": (4, 2, 1, "dense"),
           "ep2xtp2": (4, 2, 2, "moe"), "ep4xtp2": (4, 2, 4, "moe")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(folder: Path, kind: str, smoke: bool) -> str:
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    if smoke:
        return str(make_tiny_checkpoint(folder, size="nano", family="qwen3-moe" if kind == "moe" else None))
    spec = dict(SHAPES[kind])
    family, size = spec.pop("family"), spec.pop("size")
    kwargs = {"family": family} if family else {}
    return str(make_tiny_checkpoint(folder, size=size or "tiny", tokenizer="bpe", **kwargs, **spec))


def _batch(vocab: int, rows: int, tokens: int, seed: int, device):
    import torch

    g = torch.Generator().manual_seed(seed)
    prompt = tokens // 2
    ids = torch.randint(5, vocab, (rows, tokens), generator=g)
    mask = torch.ones(rows, tokens, dtype=torch.long)
    response_mask = torch.ones(rows, tokens - prompt, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(tokens).expand(rows, tokens),
             "responses": ids[:, prompt:], "response_mask": response_mask,
             "advantages": torch.randn(rows, tokens - prompt, generator=g)}
    return {k: v.to(device) for k, v in batch.items()}


def _rank(rank: int, world: int, port: int, model_dir: str, tp: int, ep: int, steps: int, rows: int, tokens: int,
          bucket_mb: int, smoke: bool, out: str) -> None:
    import torch
    import torch.distributed as dist

    from hybridflow.config.schema import FSDPConfig, MixedPrecisionConfig, OptimConfig, WrapPolicy
    from hybridflow.engine.expert_parallel import EP_TRAFFIC
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.reshard import peak_rss_bytes, reset_peak_rss, reshard_in_buckets
    from hybridflow.engine.train_engine import TrainEngine

    gpu = not smoke
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cuda" if gpu else "cpu")
    if gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    precision = MixedPrecisionConfig(param_dtype="bf16" if gpu else None, reduce_dtype="fp32" if gpu else None)
    fsdp = FSDPConfig(wrap_policy=WrapPolicy(min_num_params=0), param_offload=False, grad_offload=False,
                      optimizer_offload=False, offload_policy=False, reshard_after_forward=True, fsdp_size=-1,
                      forward_prefetch=False, model_dtype="fp32", dtype="bf16" if gpu else "fp32",
                      use_orig_params=False, seed=0, full_determinism=False, mixed_precision=precision)
    optim = OptimConfig(optimizer="AdamW", optimizer_impl="torch.optim", lr=1e-5, lr_warmup_steps_ratio=0.0,
                        lr_warmup_steps=-1, total_training_steps=steps, weight_decay=0.0, betas=[0.9, 0.999],
                        clip_grad=1.0, min_lr_ratio=0.0, num_cycles=0.5, lr_scheduler_type="constant",
                        warmup_style=None, override_optimizer_config=None)
    model = load_causal_lm(model_dir)
    engine = TrainEngine(model.train(), fsdp, optim, steps, role="actor", parallel_dims=ParallelDims(world, tp=tp, ep=ep))
    vocab = model.config.vocab_size
    times = []
    for step in range(steps):
        batch = _batch(vocab, rows, tokens, seed=step * 100 + engine.dp_rank, device=device)
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        lp, _ = response_log_probs(engine.module, batch, 1.0, sequence_parallel=engine.sequence_parallel)
        mask = batch["response_mask"].float()
        loss = -(lp * batch["advantages"] * mask).sum() / mask.sum()
        loss.backward()
        engine.optimizer_step(grad_clip=1.0)
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak_train = torch.cuda.max_memory_allocated() if gpu else peak_rss_bytes()
    rollout = load_causal_lm(model_dir, dtype="bf16" if gpu else "fp32").to(device).eval()
    own = dict(rollout.state_dict())

    def load(bucket):
        for name, tensor in bucket:
            own[name].copy_(tensor)

    def transition(mode: str) -> tuple[float, int]:
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            reset_peak_rss()
            base = peak_rss_bytes() or 0
        start = time.perf_counter()
        if mode == "bucketed":
            reshard_in_buckets(engine.module, load, bucket_mb << 20, device=device)
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            full = get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True))
            with torch.no_grad():
                rollout.load_state_dict(full, strict=False)
            del full
        if gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() if gpu else (peak_rss_bytes() or 0)
        return seconds, max(0, peak - base)

    bucketed, full = transition("bucketed"), transition("full")
    measured = times[1:] or times
    result = {"step_s": statistics.median(measured), "tokens_per_s": rows * tokens / statistics.median(measured),
              "peak_train_gib": peak_train / 2**30 if peak_train else None, "ep_mib": EP_TRAFFIC.bytes / 2**20, "bucketed_s": bucketed[0], "bucketed_rise_mib":
              bucketed[1] / 2**20, "full_s": full[0], "full_rise_mib": full[1] / 2**20}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def run_layout(name: str, model_dir: str, args, workdir: Path) -> dict:
    world, tp, ep, _ = LAYOUTS[name]
    if not args.cpu_smoke:
        import torch

        if torch.cuda.device_count() < world:
            return {"layout": name, "skipped": f"needs {world} GPUs, {torch.cuda.device_count()} visible"}
    port, out = _free_port(), workdir / f"tp_ep_{name}"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), str(port), model_dir, str(tp),
                               str(ep), str(args.steps), str(args.rows), str(args.tokens), str(args.bucket_mb),
                               str(int(args.cpu_smoke)), str(out)], env=env) for r in range(world)]
    for p in procs:
        if p.wait(timeout=3600) != 0:
            raise SystemExit(f"layout {name}: a rank failed (exit {p.returncode})")
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world)]
    row = {"layout": name, "ranks": world}
    for key in ranks[0]:
        values = [r[key] for r in ranks if r[key] is not None]
        row[key] = (min(values) if key == "tokens_per_s" else max(values)) if values else None
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        a = sys.argv[2:]
        _rank(int(a[0]), int(a[1]), int(a[2]), a[3], int(a[4]), int(a[5]), int(a[6]), int(a[7]), int(a[8]),
              int(a[9]), bool(int(a[10])), a[11])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", default="tp2,ep2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--cpu-smoke", action="store_true", help="CPU, gloo, nano shapes, 2 steps: the code path only")
    args = ap.parse_args()
    if args.cpu_smoke:
        args.steps, args.rows, args.tokens, args.bucket_mb = 2, 4, 16, 1
    workdir = Path(tempfile.mkdtemp(prefix="bench_tp_ep_"))
    models: dict[str, str] = {}
    rows = []
    for name in args.layouts.split(","):
        kind = LAYOUTS[name][3]
        if kind not in models:
            models[kind] = build_model(workdir / kind, kind, args.cpu_smoke)
        rows.append(run_layout(name, models[kind], args, workdir))
    print(f"bench_tp_ep {'(CPU smoke: the code path only)' if args.cpu_smoke else ''} "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
