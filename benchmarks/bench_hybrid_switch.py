"""The 3D-HybridEngine switch against today's all-gather path (issue 39 item 3), on 4 CPU processes.

For each training layout in ``--layouts`` (pp x tp, FSDP over the remaining dp; ``TrainEngine`` as the trainer builds
it) and each rollout tensor-parallel size in ``--rollout-tps``, ``world`` gloo processes (one torch thread each)
move the actor's weights into the rollout ``--repeats`` times each way:

* ``switch`` -- :func:`hybridflow.engine.shard_switch.switch_to_rollout`: the rollout is split over shard groups of
  tp_r ranks (``rollout/hf/shard_model.py``, built without storage) and each rank receives only the slices of its
  shard, ``--bucket-mb`` of full tensors at a time; where the training layout is the rollout's
  (``workers/sharded_rollout.reuses_training_shards``: training tp = tp_r, pp 1) the engine generates with the
  actor's module itself, so the row reports what the generation's FSDP unshard (over dp) receives instead;
* ``all-gather`` -- :func:`hybridflow.engine.reshard.reshard_in_buckets` into a whole rollout copy on every rank (what
  the hf engine next to a split actor held before: each rank gathers every tensor).

Per rank it records the bytes received, the seconds (median of the repeats after a warm-up round) and the rise of
the peak resident memory during the transition (``VmHWM`` reset through ``/proc/self/clear_refs``; glibc's mmap
threshold pinned so that freed buffers leave the resident set), plus the bytes of the rollout weights the rank
holds.  The table shows the max over ranks next to the formulas of HybridFlow §5 (M = model bytes, t / p / d the
training tp / pp / dp, t_g the rollout's tp, p_g = 1):

* bytes a rank must receive at least: M / t_g - (the part of its training shard inside its rollout shard) =
  M / t_g - M / (t p d) with HybridFlow's grouping (``rollout_shard_groups``); the paper, whose training keeps
  M / (t p) per rank (no FSDP), writes it (t p - t_g p_g) / (t_g p_g t p) M;
* all-gather: M - M / (t p d) received, a whole copy M held (redundancy M - M / t_g per rank).

Run: ``.venv/bin/python benchmarks/bench_hybrid_switch.py [--smoke] [--size base100m] [--plot out.png]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

# name -> (pp, tp)
LAYOUTS = {"tp1": (1, 1), "tp2": (1, 2), "tp4": (1, 4), "pp2": (2, 1), "pp2xtp2": (2, 2)}


def _fsdp():
    from hybridflow.config.schema import FSDPConfig, WrapPolicy

    return FSDPConfig(wrap_policy=WrapPolicy(min_num_params=0), param_offload=False, grad_offload=False,
                      optimizer_offload=False, offload_policy=False, reshard_after_forward=True, fsdp_size=-1,
                      forward_prefetch=False, model_dtype="fp32", dtype="fp32", use_orig_params=False, seed=0,
                      full_determinism=False)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _switch_rounds(engine, model_dir, tp_r, bucket_mb, repeats, rank, world) -> dict:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from hybridflow.engine.model_loader import load_hf_config
    from hybridflow.engine.shard_switch import plan_switch, switch_to_rollout
    from hybridflow.rollout.hf.lockstep import rollout_shard_groups
    from hybridflow.rollout.hf.shard_model import build_model_shard
    from hybridflow.workers.sharded_rollout import reuses_training_shards

    dims = engine.parallel_dims
    groups = rollout_shard_groups(world, tp_r, dims.tp if dims.pp == 1 else 1)
    if reuses_training_shards(dims, groups, lora=False):
        return _in_place_rounds(engine, repeats)
    mesh = DeviceMesh("cpu", torch.tensor(groups), mesh_dim_names=("rdp", "rtp"))["rtp"]
    shard = build_model_shard(load_hf_config(model_dir, False, None, "model"), mesh, "cpu", torch.float32,
                              engine.module)
    plan = plan_switch(engine.module, shard)
    rounds = []
    for i in range(repeats + 1):
        import torch.distributed as dist

        dist.barrier()
        stats = switch_to_rollout(engine.module, shard, plan, bucket_mb << 20)
        if i:
            rounds.append({"s": stats.seconds, "recv": stats.received_bytes, "rise": stats.peak_rss_rise_bytes})
    held = sum(t.to_local().numel() * t.element_size() if hasattr(t, "to_local") else t.numel() * t.element_size()
               for t in shard.state_dict().values())
    return {"rounds": rounds, "held": held, "redundancy": plan.redundancy(rank), "in_place": False}


def _in_place_rounds(engine, repeats) -> dict:
    """The actor's own module generates: the transition is FSDP's unshard of the rank's tp shard (over dp)."""
    from hybridflow.engine.reshard import peak_rss_bytes, reset_peak_rss

    rounds = []
    for i in range(repeats + 1):
        reset_peak_rss()
        before = _rss()
        start = time.perf_counter()
        with engine.full_params() as module:  # unsharded over dp: the parameters are the rank's tp pieces
            held = sum((t.to_local() if hasattr(t, "to_local") else t).numel() * t.element_size()
                       for t in module.parameters())
            seconds = time.perf_counter() - start
            rise = peak_rss_bytes() - before
        own = sum(p.to_local().numel() * p.element_size() for p in engine.module.parameters()
                  if hasattr(p, "to_local"))
        if i:
            rounds.append({"s": seconds, "recv": max(0, held - own), "rise": rise})
    return {"rounds": rounds, "held": held, "redundancy": 0, "in_place": True}


def _gather_rounds(engine, model_dir, bucket_mb, repeats) -> dict:
    import torch
    import torch.distributed as dist

    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.reshard import reshard_in_buckets

    copy = load_causal_lm(model_dir).eval()
    own = dict(copy.state_dict())

    def load(bucket):
        for name, tensor in bucket:
            own[name].copy_(tensor)

    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
                for p in engine.module.parameters())
    rounds = []
    for i in range(repeats + 1):
        dist.barrier()
        stats = reshard_in_buckets(engine.module, load, bucket_mb << 20)
        if i:
            rounds.append({"s": stats.seconds, "recv": stats.bytes - local, "rise": stats.peak_rss_rise_bytes})
    held = sum(t.numel() * t.element_size() for t in own.values())
    del copy, own
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return {"rounds": rounds, "held": held}


def _rank(rank: int, world: int, port: int, model_dir: str, pp: int, tp: int, tps: str, bucket_mb: int,
          repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    import logging

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine

    engine = TrainEngine(load_causal_lm(model_dir), _fsdp(), None, role="rollout",
                         parallel_dims=ParallelDims(world, tp=tp, pp=pp))
    train_bytes = sum((p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
                      for p in engine.module.parameters())
    result = {"train_bytes": train_bytes, "switch": {}}
    for tp_r in (int(x) for x in tps.split(",")):
        result["switch"][tp_r] = _switch_rounds(engine, model_dir, tp_r, bucket_mb, repeats, rank, world)
    result["gather"] = _gather_rounds(engine, model_dir, bucket_mb, repeats)
    Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def _run_layout(name, model_dir, tps, bucket_mb, repeats, workdir: Path, world: int) -> list[dict]:
    pp, tp = LAYOUTS[name]
    port = _free_port()
    out = workdir / f"switch_{name}"
    env = {**C.single_thread_env(), "MALLOC_MMAP_THRESHOLD_": "65536"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), str(port), model_dir, str(pp),
                               str(tp), tps, str(bucket_mb), str(repeats), str(out)], env=env) for r in range(world)]
    for p in procs:
        if p.wait(timeout=3600) != 0:
            raise SystemExit(f"layout {name}: a rank failed (exit {p.returncode})")
    ranks = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(world)]
    return _rows(name, pp, tp, world, ranks)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _summary(per_rank: list[dict]) -> dict:
    mib = 2 ** 20
    return {"recv_mib": max(statistics.median(x["recv"] for x in r["rounds"]) for r in per_rank) / mib,
            "rise_mib": max(statistics.median(x["rise"] for x in r["rounds"]) for r in per_rank) / mib,
            "s": max(statistics.median(x["s"] for x in r["rounds"]) for r in per_rank),
            "held_mib": max(r["held"] for r in per_rank) / mib}


def _rows(name, pp, tp, world, ranks) -> list[dict]:
    dp = world // (pp * tp)
    model = ranks[0]["gather"]["held"]
    mib = 2 ** 20
    gather = _summary([r["gather"] for r in ranks])
    rows = []
    for tp_r in ranks[0]["switch"]:
        switch = _summary([r["switch"][tp_r] for r in ranks])
        g = int(tp_r)
        rows.append({
            "layout": name, "pp": pp, "tp": tp, "dp": dp, "tp_r": g, "model_mib": model / mib,
            "train_mib": max(r["train_bytes"] for r in ranks) / mib, "switch": switch, "gather": gather,
            "in_place": ranks[0]["switch"][tp_r]["in_place"],
            "formula_recv_mib": (model / g - model / (tp * pp * dp)) / mib if g * pp * dp >= 1 else None,
            "paper_recv_mib": (tp * pp - g) / (g * tp * pp) * model / mib,
            "gather_formula_recv_mib": (model - model / (tp * pp * dp)) / mib,
            "redundancy_mib": max(r["switch"][tp_r]["redundancy"] for r in ranks) / mib,
        })
    return rows


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['layout']}->tp{r['tp_r']}" for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    x = range(len(rows))
    for ax, key, title in zip(axes, ("recv_mib", "held_mib", "s"),
                              ("MiB received per rank", "MiB of rollout weights held per rank", "seconds")):
        ax.bar([i - 0.2 for i in x], [r["gather"][key] for r in rows], 0.4, label="all-gather (today)")
        ax.bar([i + 0.2 for i in x], [r["switch"][key] for r in rows], 0.4, label="switch (shards)")
        if key == "recv_mib":
            ax.scatter(list(x), [r["redundancy_mib"] for r in rows], color="k", marker="_", s=200, zorder=3,
                       label="what the rank lacks (minimum)")
        ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=8)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"training layout -> rollout tp on 4 CPU processes, {rows[0]['model_mib']:.0f} MiB model (fp32)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        r, world, port, model_dir, pp, tp, tps, bucket_mb, repeats, out = sys.argv[2:12]
        _rank(int(r), int(world), int(port), model_dir, int(pp), int(tp), tps, int(bucket_mb), int(repeats), out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="base100m")
    ap.add_argument("--layouts", default="tp1,tp2,tp4,pp2,pp2xtp2")
    ap.add_argument("--rollout-tps", default="1,2,4")
    ap.add_argument("--bucket-mb", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="nano model (4 heads), one repeat")
    ap.add_argument("--workdir", type=Path, default=C.DEFAULT_WORKDIR)
    args = ap.parse_args()
    if args.smoke:
        args.size, args.repeats, args.bucket_mb = "nano", 1, 1
    state = C.print_state(f"bench_hybrid_switch: {args.size}, buckets of {args.bucket_mb} MiB, {args.repeats} repeats")
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    args.workdir.mkdir(parents=True, exist_ok=True)
    kv = {} if args.size != "nano" else {"num_key_value_heads": 4}
    model_dir = str(make_tiny_checkpoint(args.workdir / f"switch_model_{args.size}", size=args.size, **kv))
    rows = []
    for name in args.layouts.split(","):
        rows += _run_layout(name, model_dir, args.rollout_tps, args.bucket_mb, args.repeats, args.workdir, args.world)
    table = [[f"{r['layout']} (dp{r['dp']})", r["tp_r"], f"{r['train_mib']:.0f}",
              f"{r['gather']['recv_mib']:.0f} / {r['switch']['recv_mib']:.0f}" + (" *" if r["in_place"] else ""),
              f"{r['gather_formula_recv_mib']:.0f} / {r['formula_recv_mib']:.0f}",
              f"{r['gather']['held_mib']:.0f} / {r['switch']['held_mib']:.0f}",
              f"{r['gather']['rise_mib']:.0f} / {r['switch']['rise_mib']:.0f}",
              f"{r['gather']['s']:.2f} / {r['switch']['s']:.2f}"] for r in rows]
    C.print_table(["training layout", "rollout tp", "training shard MiB", "MiB received (gather / switch)",
                   "formula MiB (gather / switch)", "rollout weights held MiB", "peak rise MiB", "seconds"], table)
    if args.plot:
        _plot(rows, args.plot)
    print(json.dumps({"state": state, "rows": rows}))


if __name__ == "__main__":
    main()
