"""Training layout -> rollout copy: bucketed resharding vs gathering a full state dict (issue 26 item 3).

For each layout in ``--layouts`` the script starts ``world`` processes (gloo, one torch thread each).  Every rank
builds the actor as the trainer does -- ``TrainEngine`` on ``ParallelDims(world, tp=, ep=)``: DTensor tensor /
expert parallelism, FSDP2 over the rest -- and a plain, unsharded rollout copy of the same model (what the ``hf``
engine next to a split actor generates with), then moves the actor's weights into the copy ``--repeats`` times
each way:

* ``bucketed`` -- :func:`hybridflow.engine.reshard.reshard_in_buckets`: parameters gathered one at a time,
  ``--bucket-mb`` at a time, each bucket copied into the rollout copy and dropped (what the worker does after
  every update);
* ``full`` -- ``get_model_state_dict(full_state_dict=True)`` on every rank, then ``load_state_dict`` into the copy
  (a second full copy of the model alive on every rank until it is loaded).

Per rank it records the bytes gathered, the seconds (median), and the rise of the peak resident memory during the
transition (``VmHWM`` after minus ``VmRSS`` before, the high-water mark reset through ``/proc/self/clear_refs``;
glibc's mmap threshold is pinned so freed tensors leave the resident set).  A warm-up round of each is not recorded.
The table shows the max over ranks; ``model MiB`` is the full fp32 model, the floor of what ``full`` must hold.

Run: ``.venv/bin/python benchmarks/bench_reshard.py [--smoke] [--size medium] [--layouts tp2,ep2,dp2xtp2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

# name -> (world, tp, ep, MoE model)
LAYOUTS = {"tp2": (2, 2, 1, False), "ep2": (2, 1, 2, True), "dp2xtp2": (4, 2, 1, False), "ep2xtp2": (4, 2, 2, True)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, model_dir: str, tp: int, ep: int, bucket_mb: int, repeats: int,
          out: str) -> None:
    import torch
    import torch.distributed as dist

    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.reshard import peak_rss_bytes, reset_peak_rss, reshard_in_buckets
    from hybridflow.engine.train_engine import TrainEngine

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    import logging

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)  # "2 sequential all_gathers"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from hybridflow.config.schema import FSDPConfig, WrapPolicy

    fsdp = FSDPConfig(wrap_policy=WrapPolicy(min_num_params=0), param_offload=False, grad_offload=False,
                      optimizer_offload=False, offload_policy=False, reshard_after_forward=True, fsdp_size=-1,
                      forward_prefetch=False, model_dtype="fp32", dtype="fp32", use_orig_params=False, seed=0,
                      full_determinism=False)
    engine = TrainEngine(load_causal_lm(model_dir), fsdp, None, role="rollout",
                         parallel_dims=ParallelDims(world, tp=tp, ep=ep))
    rollout = load_causal_lm(model_dir).eval()
    own = dict(rollout.state_dict())

    def load(bucket):
        for name, tensor in bucket:
            own[name].copy_(tensor)

    def rss() -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    results = {"bucketed": [], "full": []}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    for i in range(repeats + 1):  # the first round warms both paths up (DTensor caches, gloo buffers): not recorded
        for mode in ("bucketed", "full"):
            dist.barrier()
            if mode == "bucketed":
                stats = reshard_in_buckets(engine.module, load, bucket_mb << 20)
                if i:
                    results[mode].append({"s": stats.seconds, "bytes": stats.bytes, "rise": stats.peak_rss_rise_bytes,
                                          "buckets": stats.buckets, "max_bucket": stats.max_bucket_bytes})
                continue
            reset_peak_rss()
            before = rss()
            import time

            start = time.perf_counter()
            full = get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True))
            nbytes = sum(t.numel() * t.element_size() for t in full.values())
            with torch.no_grad():
                rollout.load_state_dict(full, strict=False)
            del full
            seconds = time.perf_counter() - start
            if i:
                results[mode].append({"s": seconds, "bytes": nbytes, "rise": peak_rss_bytes() - before})
    model_bytes = sum(t.numel() * t.element_size() for t in own.values())
    with torch.no_grad():  # the copy holds the actor's weights either way
        probe = next(n for n in own if n.endswith("embed_tokens.weight"))
        full = dict(engine.module.state_dict())[probe]
        assert torch.equal(own[probe], full.full_tensor() if hasattr(full, "full_tensor") else full)
    Path(out).with_suffix(f".rank{rank}.json").write_text(json.dumps({"model_bytes": model_bytes, **results}))
    dist.barrier()
    dist.destroy_process_group()


def _env() -> dict[str, str]:
    """One torch thread; glibc's mmap threshold fixed at 64 KiB so a freed tensor's memory leaves the process at
    once (with the default dynamic threshold, freed buffers of a few MiB stay in the heap and the resident set
    only ever grows, which would hide what a transition frees)."""
    return {**C.single_thread_env(), "MALLOC_MMAP_THRESHOLD_": "65536"}


def _run_layout(name: str, model_dir: str, bucket_mb: int, repeats: int, workdir: Path) -> dict:
    world, tp, ep, _ = LAYOUTS[name]
    port = _free_port()
    out = workdir / f"reshard_{name}"
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), str(port), model_dir, str(tp),
                               str(ep), str(bucket_mb), str(repeats), str(out)], env=_env())
             for r in range(world)]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise SystemExit(f"layout {name}: a rank failed (exit {p.returncode})")
    ranks = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in range(world)]
    row = {"layout": name, "world": world, "model_mib": ranks[0]["model_bytes"] / 2**20}
    for mode in ("bucketed", "full"):
        row[mode] = {
            "s": max(statistics.median(x["s"] for x in r[mode]) for r in ranks),
            "mib": max(r[mode][0]["bytes"] for r in ranks) / 2**20,
            "rise_mib": max(statistics.median(x["rise"] for x in r[mode]) for r in ranks) / 2**20,
        }
    row["buckets"] = ranks[0]["bucketed"][0]["buckets"]
    row["max_bucket_mib"] = max(r["bucketed"][0]["max_bucket"] for r in ranks) / 2**20
    return row


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        r, world, port, model_dir, tp, ep, bucket_mb, repeats, out = sys.argv[2:11]
        _rank(int(r), int(world), int(port), model_dir, int(tp), int(ep), int(bucket_mb), int(repeats), out)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="medium")
    ap.add_argument("--layouts", default="tp2,ep2,dp2xtp2")
    ap.add_argument("--bucket-mb", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="nano model, one repeat (seconds)")
    ap.add_argument("--workdir", type=Path, default=C.DEFAULT_WORKDIR)
    args = ap.parse_args()
    if args.smoke:
        args.size, args.repeats, args.bucket_mb = "nano", 1, 1
    state = C.print_state(f"bench_reshard: {args.size}, buckets of {args.bucket_mb} MiB, {args.repeats} repeats")
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    args.workdir.mkdir(parents=True, exist_ok=True)
    models = {}
    rows = []
    for name in args.layouts.split(","):
        moe = LAYOUTS[name][3]
        if moe not in models:
            folder = args.workdir / f"reshard_model_{args.size}_{'moe' if moe else 'dense'}"
            models[moe] = str(make_tiny_checkpoint(folder, size=args.size, family="qwen3-moe" if moe else None))
        rows.append(_run_layout(name, models[moe], args.bucket_mb, args.repeats, args.workdir))
    table = [[r["layout"], r["world"], f"{r['model_mib']:.1f}", f"{r['bucketed']['mib']:.1f}",
              f"{r['full']['mib']:.1f}", f"{r['bucketed']['rise_mib']:.1f}", f"{r['full']['rise_mib']:.1f}",
              f"{r['bucketed']['s']:.3f}", f"{r['full']['s']:.3f}", r["buckets"], f"{r['max_bucket_mib']:.1f}"]
             for r in rows]
    C.print_table(["layout", "ranks", "model MiB", "bucketed MiB gathered", "full MiB gathered",
                   "bucketed peak rise MiB", "full peak rise MiB", "bucketed s", "full s", "buckets",
                   "largest bucket MiB"], table)
    print(json.dumps({"state": state, "rows": rows}))


if __name__ == "__main__":
    main()
