"""The 3D-HybridEngine switch on a 7B-shaped model, training tp 4 -> rollout tp 2, on ONE GPU (issue 39 item 5).

Four processes share the GPU (NCCL refuses two ranks on one device, so the process group is gloo and the switch's
packed buffers go through host memory: ``engine/shard_switch._all_to_all``).  Each rank holds, in bf16 on the GPU,
its training shard (the model split over 4 ranks by the training TP plans, ``engine/tensor_parallel.py``: 1/4) and
its rollout shard (split over 2, HybridFlow's grouping [(0, 2), (1, 3)], built without storage by
``rollout/hf/shard_model.build_model_shard``: 1/2).  Weights are random (the switch moves bytes, whatever they are).

Per rank it reports, for the switch and for today's all-gather path (every tensor gathered whole on every rank into
a whole replica of the model, bucket by bucket, what ``engine/reshard.reshard_in_buckets`` does):
bytes received, seconds, peak GPU memory during the transition (``max_memory_allocated`` after
``reset_peak_memory_stats``) and the rollout weights held.  Expected from the formulas (M = 13.5 GB in bf16): the
switch receives M/2 - M/4 per rank and holds M/2; the all-gather receives 3M/4 and holds M.

Seconds here are gloo over host memory, not NVLink: compare the bytes and the memory, not the time, with a real
multi-GPU run.  Needs torch (2.11+) and transformers, no Ray, no vLLM; ~60 GB of GPU memory; runs in about 2 minutes
on an H200.

Run: ``python benchmarks/gpu/bench_hybrid_switch_gpu.py [--layers 32] [--bucket-mb 512]``
(``--cpu-smoke``: the same code on CPU with 2 layers of width 256, how it was checked here).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPE_7B = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
                vocab_size=32000, max_position_embeddings=4096)
SHAPE_SMOKE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=4,
                   vocab_size=1024, max_position_embeddings=512)


def _config(layers: int, smoke: bool):
    from transformers import LlamaConfig

    cfg = LlamaConfig(num_hidden_layers=layers, tie_word_embeddings=False, **(SHAPE_SMOKE if smoke else SHAPE_7B))
    cfg._attn_implementation = "sdpa"
    return cfg


def _peak(device) -> int:
    import torch

    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0


def _reset(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _training_shard(cfg, device, dtype):
    import torch
    from torch.distributed.device_mesh import DeviceMesh
    from transformers import AutoModelForCausalLM

    from hybridflow.engine.tensor_parallel import apply_tensor_parallel

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    apply_tensor_parallel(model, DeviceMesh(device.type, list(range(4))))
    model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            (p.to_local() if hasattr(p, "to_local") else p).normal_(0, 0.02)
    return model


def _gather_path(train, cfg, device, dtype, bucket_bytes: int) -> dict:
    """Every tensor gathered whole on every rank (host-staged all-gather of the tp pieces), into a whole replica."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        replica = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    replica.to_empty(device=device)
    own = dict(replica.named_parameters())
    _reset(device)
    start, received = time.perf_counter(), 0
    with torch.no_grad():
        for name, p in train.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if not hasattr(p, "placements") or not p.placements[0].is_shard():
                own[name].copy_(local)
                continue
            parts = [torch.empty_like(local, device="cpu") for _ in range(dist.get_world_size())]
            dist.all_gather(parts, local.cpu())
            own[name].copy_(torch.cat(parts, dim=p.placements[0].dim).to(device))
            received += (len(parts) - 1) * local.numel() * local.element_size()
    seconds = time.perf_counter() - start
    held = sum(t.numel() * t.element_size() for t in own.values())
    out = {"s": seconds, "received": received, "peak": _peak(device), "held": held}
    del replica, own
    return out


def _switch_path(train, cfg, device, dtype, bucket_bytes: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hybridflow.engine.shard_switch import plan_switch, switch_to_rollout
    from hybridflow.rollout.hf.lockstep import rollout_shard_groups
    from hybridflow.rollout.hf.shard_model import build_model_shard

    groups = rollout_shard_groups(4, 2, tp_train=4)
    mesh = DeviceMesh(device.type, torch.tensor(groups), mesh_dim_names=("rdp", "rtp"))["rtp"]
    shard = build_model_shard(cfg, mesh, device, dtype, train)
    plan = plan_switch(train, shard)
    switch_to_rollout(train, shard, plan, bucket_bytes)  # warm-up
    _reset(device)
    stats = switch_to_rollout(train, shard, plan, bucket_bytes)
    held = sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size()
               for t in shard.state_dict().values())
    return {"s": stats.seconds, "received": stats.received_bytes, "peak": _peak(device), "held": held,
            "redundancy": plan.redundancy(dist.get_rank())}


def _rank(rank: int, port: int, layers: int, bucket_mb: int, smoke: bool, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="4")
    dist.init_process_group("gloo", rank=rank, world_size=4)
    device = torch.device("cpu" if smoke else "cuda:0")
    dtype = torch.float32 if smoke else torch.bfloat16
    cfg = _config(layers, smoke)
    train = _training_shard(cfg, device, dtype)
    train_bytes = sum(p.to_local().numel() * p.element_size() for p in train.parameters() if hasattr(p, "to_local"))
    switch = _switch_path(train, cfg, device, dtype, bucket_mb << 20)
    dist.barrier()
    gather = _gather_path(train, cfg, device, dtype, bucket_mb << 20)
    Path(f"{out}.rank{rank}").write_text(json.dumps({"train": train_bytes, "switch": switch, "gather": gather}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        r, port, layers, bucket_mb, smoke, out = sys.argv[2:8]
        _rank(int(r), int(port), int(layers), int(bucket_mb), smoke == "1", out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--out", default="/tmp/hybrid_switch_gpu")
    args = ap.parse_args()
    layers = 2 if args.cpu_smoke else args.layers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(port), str(layers), str(args.bucket_mb),
                               "1" if args.cpu_smoke else "0", args.out], env=env) for r in range(4)]
    for p in procs:
        if p.wait(timeout=900) != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
    ranks = [json.loads(Path(f"{args.out}.rank{r}").read_text()) for r in range(4)]
    gib = float(1 << 30)
    print(f"7B-shaped Llama ({layers} layers), training tp 4 -> rollout tp 2 on one GPU, 4 ranks; max over ranks:")
    print("| path | GiB received | GiB rollout weights held | peak GPU GiB during | seconds |")
    print("|---|---|---|---|---|")
    for path in ("gather", "switch"):
        row = [max(r[path][k] for r in ranks) for k in ("received", "held", "peak", "s")]
        print(f"| {path} | {row[0] / gib:.2f} | {row[1] / gib:.2f} | {row[2] / gib:.2f} | {row[3]:.2f} |")
    print(f"training shard per rank: {max(r['train'] for r in ranks) / gib:.2f} GiB; switch redundancy (received = "
          f"what the rank lacked): {max(r['switch']['redundancy'] for r in ranks) / gib:.2f} GiB")
    print(json.dumps(ranks))


if __name__ == "__main__":
    main()
