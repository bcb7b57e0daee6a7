"""GPU memory per device and step time of Ulysses sequence parallelism (SP = 1, 2, 4) on a long sequence.

NOT RUN YET: written without a multi-GPU machine.  Needs one NVIDIA GPU per rank of the largest SP size (SP = 4:
4 GPUs on one node; NCCL cannot put two ranks on one GPU); sizes with more ranks than visible GPUs are skipped
with a line saying so.  Model: a Qwen2.5-1.5B-shaped decoder (1536 hidden, 28 layers, 12 query / 2 key-value
heads -- 2 KV heads, so SP = 4 repeats each twice) built from its config with random weights (nothing is
downloaded), fp32 master weights, bf16 compute, FSDP2 over the SP ranks, gradient checkpointing on, flash
attention when ``flash_attn`` is importable (sdpa otherwise).  One micro-batch of ``--tokens`` tokens (default
32768, in 4 packed sequences) through the actor's training step: forward with the sequence split over the
ranks, token-mean loss on the log-probs, backward, AdamW step.

Per SP size it prints the max over ranks of ``torch.cuda.max_memory_allocated`` (GiB), the median step time,
tokens/s per GPU and the loss (equal across SP sizes up to bf16 rounding: the same weights and tokens).

    python benchmarks/gpu/bench_sp_gpu.py [--tokens 32768] [--sp 1,2,4] [--steps 3]

Record the printed table, dated, in benchmarks/RESULTS.md (section "Ulysses sequence parallelism").
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SHAPE = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
             num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
SEQUENCES = 4


def build_model(path: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", **SHAPE)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)


def worker(rank: int, world: int, port: int, model_dir: str, tokens: int, steps: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cuda")
    import warnings

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    if world > 1:
        dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    from hybridflow.launch.config import load_config
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import enable_gradient_checkpointing, load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                           "critic.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.optim.lr=1e-6"])
    actor = cfg.actor_rollout_ref.actor
    module = load_causal_lm(model_dir).train()
    enable_gradient_checkpointing(module)
    engine = TrainEngine(module, actor.fsdp_config, actor.optim, total_training_steps=steps + 1,
                         parallel_dims=ParallelDims(world, sp=world))
    g = torch.Generator().manual_seed(0)
    length = tokens // SEQUENCES
    ids = torch.randint(10, SHAPE["vocab_size"], (SEQUENCES, length), generator=g)
    mask = torch.ones_like(ids)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(length).expand(SEQUENCES, -1),
             "responses": ids[:, 16:]}
    batch = {k: v.cuda() for k, v in batch.items()}
    weights = mask[:, 16:].float().cuda()
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in range(steps + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        lp, _ = response_log_probs(engine.module, batch, sequence_parallel=engine.sequence_parallel)
        loss = -(lp * weights).sum() / weights.sum()
        loss.backward()
        engine.optimizer_step(1.0)
        torch.cuda.synchronize()
        if step:
            times.append(time.perf_counter() - start)
            losses.append(float(loss))
    result = {"peak_gib": torch.cuda.max_memory_allocated() / 2**30, "step_s": statistics.median(times),
              "loss": losses[0], "attn": module.config._attn_implementation}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(result))
    if world > 1:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--sp", default="1,2,4")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        r, w, port, model, tokens, steps, out = args.worker
        worker(int(r), int(w), int(port), model, int(tokens), int(steps), out)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_sp_gpu: no CUDA device visible; this script measures GPU memory (see benchmarks/"
              "bench_sequence_parallel.py for the CPU measurement)")
        return 1
    gpus = torch.cuda.device_count()
    sizes = [int(x) for x in args.sp.split(",")]
    work = Path(tempfile.mkdtemp(prefix="hf_sp_gpu_"))
    build_model(work / "model")
    print(f"== Ulysses SP on GPU: Qwen2.5-1.5B shape, {args.tokens} tokens in {SEQUENCES} sequences, bf16, "
          f"checkpointing on, {torch.cuda.get_device_name(0)} x {gpus}  [{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}]")
    print("| sp | GPUs | tokens / GPU | peak allocated GiB / GPU | step s | tokens/s/GPU | loss | attention |")
    print("|---|---|---|---|---|---|---|---|")
    for sp in sizes:
        if sp > gpus:
            print(f"| {sp} | - | - | skipped: needs {sp} GPUs, {gpus} visible | | | | |")
            continue
        out = work / f"sp{sp}"
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(sp), port, str(work / "model"),
                                   str(args.tokens), str(args.steps), str(out)],
                                  env={**os.environ, "PYTHONPATH": str(REPO)}) for r in range(sp)]
        if any(p.wait() != 0 for p in procs):
            print(f"| {sp} | {sp} | - | failed (see the output above) | | | | |")
            continue
        ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(sp)]
        peak = max(r["peak_gib"] for r in ranks)
        step = max(r["step_s"] for r in ranks)
        print(f"| {sp} | {sp} | {args.tokens // sp} | {peak:.2f} | {step:.3f} | {args.tokens / sp / step:.0f} "
              f"| {ranks[0]['loss']:.5f} | {ranks[0]['attn']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
