"""Pipeline parallelism on CPU: the bubble of 1F1B and GPipe, measured, next to the schedule's formula.

Two gloo processes (one torch thread each, one per core of this machine) form one pipeline of two stages (pp 2,
dp 1) and run the actor's update pass through the real path -- ``TrainEngine.backward_passes`` with the pipeline
head of ``engine/forward.py`` (log-probs of the response tokens), a token-mean loss per micro-batch -- for ``m``
micro-batches of the same shape.  The same work without a pipeline (the whole model in one process, one thread,
the micro-batches one after another) is measured first: ``T_single``.  With a perfect split each stage does half
of it, so the pipeline's ideal time is ``T_single / pp``; the measured bubble is

    bubble = 1 - (T_single / pp) / T_pipe

(the time the stages wait for each other, plus the point-to-point traffic and the schedule's own work), printed
beside the formula of both schedules, ``(pp - 1) / (m + pp - 1)``.  GPipe runs every forward before any backward
and keeps the activations of all m micro-batches; 1F1B keeps at most pp in flight: the growth of each rank's
resident memory during the pass (``VmHWM`` reset before it; every process runs with ``MALLOC_MMAP_THRESHOLD_``
fixed at 64 KiB so that freed tensors leave the resident set at once) shows that difference.

Run: ``.venv/bin/python benchmarks/bench_pipeline.py [--smoke] [--micro 2,4,8] [--size small]``.
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

ROWS, LENGTH, RESPONSE = 4, 128, 64  # one micro-batch: 4 rows of 128 tokens, the last 64 the response


def _batches(m: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(m):
        ids = torch.randint(5, vocab, (ROWS, LENGTH), generator=g)
        mask = torch.ones_like(ids)
        out.append({"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(LENGTH).expand(ROWS, -1),
                    "responses": ids[:, -RESPONSE:], "response_mask": mask[:, -RESPONSE:].float()})
    return out


def _peak_reset() -> int | None:
    from hybridflow.engine.reshard import _rss_bytes, reset_peak_rss

    return _rss_bytes() if reset_peak_rss() else None


def _peak_rise(before: int | None) -> float:
    from hybridflow.engine.reshard import peak_rss_bytes

    peak = peak_rss_bytes()
    return (peak - before) / 2**20 if before is not None and peak is not None else float("nan")


def _engine(model_dir: str, world: int, schedule: str | None):
    import warnings

    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.engine.parallel.parallelize import PipelineSpec
    from hybridflow.engine.parallel_dims import ParallelDims
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.launch.config import load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                           "critic.ppo_micro_batch_size_per_gpu=1"])
    actor = cfg.actor_rollout_ref.actor
    dims = ParallelDims(world, pp=world) if schedule else ParallelDims(1)
    return TrainEngine(load_causal_lm(model_dir).train(), actor.fsdp_config, actor.optim, parallel_dims=dims,
                       pipeline=PipelineSpec(schedule=schedule) if schedule else None)


def _time_passes(engine, batches, repeats: int) -> tuple[float, float]:
    """(median seconds of one pass over the micro-batches, peak resident growth MiB) after one warm-up pass."""
    import torch.distributed as dist

    from hybridflow.engine.forward import response_token_outputs, token_outputs_pass

    tokens = sum(float(b["response_mask"].sum()) for b in batches)
    spec = token_outputs_pass(engine.module, RESPONSE, use_remove_padding=False)

    def run_one(i):
        return response_token_outputs(engine.module, batches[i], use_remove_padding=False)

    def loss(out, i):
        return -(out["log_probs"] * batches[i]["response_mask"]).sum() / tokens

    times, peak = [], 0.0
    for r in range(repeats + 1):
        if dist.is_initialized():
            dist.barrier()
        before = _peak_reset()
        start = time.perf_counter()
        engine.backward_passes(batches, spec, run_one, loss)
        elapsed = time.perf_counter() - start
        engine.zero_grad()
        if r:  # the first pass warms up
            times.append(elapsed)
            peak = max(peak, _peak_rise(before))
    return statistics.median(times), peak


def worker(rank: int, world: int, port: int, model_dir: str, micro: str, repeats: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRIDFLOW_DEVICE="cpu")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = []
    for schedule in ("1f1b", "gpipe"):
        engine = _engine(model_dir, world, schedule)
        for m in (int(x) for x in micro.split(",")):
            batches = _batches(m, engine.module.config.vocab_size)
            seconds, peak = _time_passes(engine, batches, repeats)
            results.append({"schedule": schedule, "m": m, "pipe_s": seconds, "peak_mib": peak})
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _single(model_dir: str, micro: list[int], repeats: int) -> dict[int, tuple[float, float]]:
    import torch

    torch.set_num_threads(1)
    engine = _engine(model_dir, 1, None)
    return {m: _time_passes(engine, _batches(m, engine.module.config.vocab_size), repeats) for m in micro}


def _env() -> dict[str, str]:
    return {**C.single_thread_env(), "MALLOC_MMAP_THRESHOLD_": "65536"}


def run(model_dir: str, micro: list[int], repeats: int, workdir: Path, pp: int = 2) -> list[dict]:
    out = workdir / "pipeline"
    single_json = workdir / "single.json"
    done = subprocess.run([sys.executable, __file__, "--single", model_dir, ",".join(map(str, micro)), str(repeats),
                           str(single_json)], env=_env(), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the one-process run failed:\n{(done.stdout + done.stderr)[-3000:]}")
    single = {int(m): tuple(v) for m, v in json.loads(single_json.read_text()).items()}
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(pp), port, model_dir,
                               ",".join(map(str, micro)), str(repeats), str(out)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(pp)]
    logs = [p.communicate(timeout=3600)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        if p.returncode != 0:
            raise RuntimeError(f"rank {r} failed:\n{log[-3000:]}")
    ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(pp)]
    rows = []
    for i, row in enumerate(ranks[0]):
        pipe_s = max(rk[i]["pipe_s"] for rk in ranks)
        t_single = single[row["m"]][0]
        rows.append({**row, "pipe_s": pipe_s, "single_s": t_single, "single_peak_mib": single[row["m"]][1],
                     "peak_mib": max(rk[i]["peak_mib"] for rk in ranks),
                     "bubble": 1 - (t_single / pp) / pipe_s, "formula": (pp - 1) / (row["m"] + pp - 1)})
    return rows


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="nano model, 2 and 4 micro-batches, one measured pass")
    ap.add_argument("--micro", default=None, help="comma-separated micro-batch counts (default 2,4,8)")
    ap.add_argument("--size", default=None, help="hybridflow.utils.tiny_model size (default small)")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers (split 4 + 4 over the two stages)")
    ap.add_argument("--repeats", type=int, default=None, help="measured passes after one warm-up pass")
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--single", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.single:
        model, micro, repeats, out = args.single
        result = _single(model, [int(x) for x in micro.split(",")], int(repeats))
        Path(out).write_text(json.dumps({str(m): list(v) for m, v in result.items()}))
        return 0
    if args.worker:
        r, w, port, model, micro, repeats, out = args.worker
        worker(int(r), int(w), int(port), model, micro, int(repeats), out)
        return 0
    micro = [int(x) for x in (args.micro or ("2,4" if args.smoke else "2,4,8")).split(",")]
    size = args.size or ("nano" if args.smoke else "small")
    repeats = args.repeats or (1 if args.smoke else 3)
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    workdir = C.DEFAULT_WORKDIR / "pipeline"
    model_dir = workdir / f"model_{size}_{args.layers}"
    if not (model_dir / "config.json").is_file():
        make_tiny_checkpoint(model_dir, size=size, num_hidden_layers=args.layers)
    rows = run(str(model_dir), micro, repeats, workdir)
    print(f"pipeline parallelism, pp 2 on 2 gloo processes (one thread each), {size} model, {args.layers} layers, "
          f"micro-batches of {ROWS} x {LENGTH} tokens")
    print("| schedule | m | T_single s | T_pipe s | bubble measured | (pp-1)/(m+pp-1) | peak MiB / rank | "
          "peak MiB single |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['schedule']} | {r['m']} | {r['single_s']:.3f} | {r['pipe_s']:.3f} | {r['bubble']:.2f} | "
              f"{r['formula']:.2f} | {r['peak_mib']:.1f} | {r['single_peak_mib']:.1f} |")
    for r in rows:
        print(f"bubble_{r['schedule']}_m{r['m']}={r['bubble']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
