"""Pipeline x tensor parallelism on a Qwen2.5-7B-shaped model: per-stage time and memory measured on one GPU, the
schedules' step time, bubble and tokens/s/GPU from them.

A Qwen2.5-7B-shaped decoder (28 layers, hidden 3584, 28 query / 4 key-value heads, MLP 18944, 152,064-token
vocabulary; random init, bf16) cut into ``pp`` stages of 28/pp layers.  One GPU can hold one stage of one tensor-
parallel rank, so that is what is measured: a stage's model (its layers, the embedding and the head -- the first
and last stages' ends; a middle stage has neither, so this slightly overstates it) with the heads, the MLP and the
vocabulary divided by ``tp`` (one rank's share of a tensor-parallel split), its forward and backward time per
micro-batch (``--tokens`` tokens, gradient checkpointing off) and its peak memory.  From those the script lays out
the schedules' timelines -- GPipe (all forwards, then all backwards) and 1F1B (warm-up, steady one-forward-one-
backward, cool-down) -- for ``--micro`` micro-batches, adding a point-to-point transfer of each micro-batch's
hidden states between stages at ``--link-gbps`` (NVLink-class by default) and, with tp > 1, two all-reduces per
layer of the activations at the same bandwidth.  It prints, per layout: the stage's measured forward / backward
seconds, peak memory of one stage (measured, and the training state at 16 bytes per parameter: fp32 weights,
gradients and Adam moments), the step time, the bubble fraction and tokens/s/GPU of both schedules.

On a machine with as many GPUs as pp x tp, ``torchrun --nproc-per-node N bench_pipeline_gpu.py --real`` runs the
real engine instead (``TrainEngine`` with the pipeline, NCCL) and reports the measured step time.

``--cpu-smoke``: the same code on CPU with a nano model (how it was checked without a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

QWEN25_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
             "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
NANO = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512, "tie_word_embeddings": False}


def simulate(schedule: str, pp: int, m: int, fwd: float, bwd: float, p2p: float) -> float:
    """Step time of ``m`` micro-batches over ``pp`` equal stages (each forward ``fwd``, backward ``bwd`` seconds,
    a transfer between neighbouring stages ``p2p`` seconds): the time the last backward of stage 0 ends."""
    f_end = [[0.0] * m for _ in range(pp)]
    b_end = [[0.0] * m for _ in range(pp)]
    free = [0.0] * pp
    order = {s: _order(schedule, pp, m, s) for s in range(pp)}
    done = {s: 0 for s in range(pp)}
    progress = True
    while progress:  # event-free list scheduling: run each stage's next op once its input is there
        progress = False
        for s in range(pp):
            if done[s] == len(order[s]):
                continue
            kind, i = order[s][done[s]]
            if kind == "F":
                ready = 0.0 if s == 0 else f_end[s - 1][i]
                if s > 0 and ready == 0.0:
                    continue
                start = max(free[s], ready + (p2p if s > 0 else 0.0))
                f_end[s][i] = free[s] = start + fwd
            else:
                ready = f_end[s][i] if s == pp - 1 else b_end[s + 1][i]
                if ready == 0.0:
                    continue
                start = max(free[s], ready + (p2p if s < pp - 1 else 0.0))
                b_end[s][i] = free[s] = start + bwd
            done[s] += 1
            progress = True
    if any(done[s] < len(order[s]) for s in range(pp)):
        raise RuntimeError("schedule deadlocked")
    return max(b_end[0])


def _order(schedule: str, pp: int, m: int, stage: int) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(pp - stage - 1, m)  # 1F1B: warm-up forwards, then one forward one backward, then the rest
    ops = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        ops += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    ops += [("B", i) for i in range(b, m)]
    return ops


def _stage_config(base: dict, pp: int, tp: int) -> dict:
    cfg = dict(base)
    cfg["num_hidden_layers"] = base["num_hidden_layers"] // pp
    cfg["num_attention_heads"] = base["num_attention_heads"] // tp
    cfg["num_key_value_heads"] = max(base["num_key_value_heads"] // tp, 1)
    cfg["head_dim"] = base["hidden_size"] // base["num_attention_heads"]
    cfg["intermediate_size"] = base["intermediate_size"] // tp
    cfg["vocab_size"] = base["vocab_size"] // tp
    return cfg


def measure_stage(cfg: dict, tokens: int, device: str, dtype, repeats: int = 3) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(**cfg)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, cfg["vocab_size"], (1, tokens), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fwd, bwd = [], []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for r in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        logits = model(input_ids=ids).logits
        loss = torch.log_softmax(logits.float(), -1).mean()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        del logits, loss
        if r:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    hidden_bytes = tokens * cfg["hidden_size"] * torch.finfo(dtype).bits // 8
    out = {"params": params, "fwd_s": sorted(fwd)[len(fwd) // 2], "bwd_s": sorted(bwd)[len(bwd) // 2],
           "peak_gib": peak, "train_state_gib": params * 16 / 2**30, "hidden_bytes": hidden_bytes}
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def layout_rows(base: dict, pps: list[int], tps: list[int], m: int, tokens: int, device: str, dtype,
                link_gbps: float) -> list[dict]:
    rows = []
    for tp in tps:
        for pp in pps:
            if base["num_hidden_layers"] % pp or base["num_attention_heads"] % tp:
                continue
            cfg = _stage_config(base, pp, tp)
            st = measure_stage(cfg, tokens, device, dtype)
            p2p = st["hidden_bytes"] / (link_gbps * 1e9)
            # tensor parallelism: two all-reduces of the layer's activations per layer, forward and backward
            ar = 0.0 if tp == 1 else 2 * cfg["num_hidden_layers"] * st["hidden_bytes"] * 2 * (tp - 1) / tp / (
                link_gbps * 1e9)
            fwd, bwd = st["fwd_s"] + ar, st["bwd_s"] + ar
            row = {"pp": pp, "tp": tp, "m": m, "tokens": tokens, **st, "p2p_s": p2p}
            for schedule in ("gpipe", "1f1b"):
                step = simulate(schedule, pp, m, fwd, bwd, p2p)
                ideal = m * (fwd + bwd)
                row[f"{schedule}_step_s"] = step
                row[f"{schedule}_bubble"] = 1 - ideal / step
                row[f"{schedule}_tok_s_gpu"] = m * tokens / step / (pp * tp)
            # activations in flight on stage 0: GPipe all m micro-batches, 1F1B at most pp
            act = max(st["peak_gib"] - st["params"] * 4 / 2**30, 0.0) if device == "cuda" else float("nan")
            row["gpipe_act_gib"], row["1f1b_act_gib"] = act * m, act * min(pp, m)
            rows.append(row)
    return rows


def real_run(tokens: int, m: int) -> None:
    """torchrun on pp x tp GPUs: the engine's own pipeline (NCCL), one update pass timed."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, Qwen2Config

    from hybridflow.engine.forward import response_token_outputs, token_outputs_pass
    from hybridflow.engine.parallel.parallelize import PipelineSpec
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.launch.config import load_config

    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    pp = int(os.environ.get("PP", world))
    cfg = load_config(["trainer.device=cuda", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                       "critic.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"])
    model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN25_7B), dtype=torch.float32)
    actor = cfg.actor_rollout_ref.actor
    engine = TrainEngine(model, actor.fsdp_config, actor.optim, parallel_dims=ParallelDims(world, pp=pp,
                                                                                          tp=world // pp),
                         pipeline=PipelineSpec())
    ids = torch.randint(0, QWEN25_7B["vocab_size"], (1, tokens))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "position_ids": torch.arange(tokens).unsqueeze(0), "responses": ids[:, -tokens // 2:]}
    batches = [dict(batch) for _ in range(m)]
    spec = token_outputs_pass(engine.module, tokens // 2, use_remove_padding=False)
    for r in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.backward_passes(batches, spec, lambda i: response_token_outputs(engine.module, batches[i]),
                               lambda out, i: -out["log_probs"].mean())
        torch.cuda.synchronize()
        if rank == 0 and r:
            print(json.dumps({"pp": pp, "tp": world // pp, "m": m, "step_s": time.perf_counter() - t0,
                              "tok_s_gpu": m * tokens / (time.perf_counter() - t0) / world,
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}))
        engine.zero_grad()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", default="2,4", help="pipeline sizes")
    ap.add_argument("--tp", default="1,2,4", help="tensor-parallel sizes (one rank's share measured)")
    ap.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per micro-batch")
    ap.add_argument("--link-gbps", type=float, default=400.0, help="GB/s between stages / tp ranks (assumed)")
    ap.add_argument("--cpu-smoke", action="store_true", help="nano model on CPU (fp32)")
    ap.add_argument("--real", action="store_true", help="under torchrun with pp x tp GPUs: the real engine")
    args = ap.parse_args(argv)
    if args.real:
        real_run(args.tokens, args.micro)
        return 0
    import torch

    smoke = args.cpu_smoke or not torch.cuda.is_available()
    if smoke and not args.cpu_smoke:
        print("no CUDA device: running the CPU smoke shapes")
    base, device, dtype = (NANO, "cpu", torch.float32) if smoke else (QWEN25_7B, "cuda", torch.bfloat16)
    tokens = 64 if smoke else args.tokens
    rows = layout_rows(base, [int(x) for x in args.pp.split(",")], [int(x) for x in args.tp.split(",")],
                       args.micro, tokens, device, dtype, args.link_gbps)
    name = torch.cuda.get_device_name() if not smoke else "cpu"
    print(f"Qwen2.5-7B-shaped stages on {name}, {args.micro} micro-batches of {tokens} tokens, link "
          f"{args.link_gbps} GB/s (assumed)")
    print("| pp | tp | stage params (M) | fwd s | bwd s | stage peak GiB (measured) | train state GiB (16 B/param) "
          "| GPipe step s / bubble / tok/s/GPU | 1F1B step s / bubble / tok/s/GPU | activations in flight GiB "
          "GPipe / 1F1B |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['pp']} | {r['tp']} | {r['params'] / 1e6:.0f} | {r['fwd_s']:.3f} | {r['bwd_s']:.3f} | "
              f"{r['peak_gib']:.1f} | {r['train_state_gib']:.1f} | {r['gpipe_step_s']:.2f} / "
              f"{r['gpipe_bubble']:.2f} / {r['gpipe_tok_s_gpu']:.0f} | {r['1f1b_step_s']:.2f} / "
              f"{r['1f1b_bubble']:.2f} / {r['1f1b_tok_s_gpu']:.0f} | {r['gpipe_act_gib']:.1f} / "
              f"{r['1f1b_act_gib']:.1f} |")
    print("json=" + json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
