"""GRPO step time and peak memory as batch size, response length and model size grow; RSS soak (spec S15).

Each point is a fresh process running the full hybridflow GRPO step (local backend: rollout, reward,
old log-probs, advantages, actor update) on the random-init char model, so completions run to the full
response length and the work per step is what the table says. Reported: median step time after warm-up,
peak RSS of the process, and per-token cost (step time / (prompt+response tokens)) so linear scaling reads
as a flat column.

The soak runs many steps of one configuration and fits a least-squares line to the RSS after every step
(``perf/cpu_memory_used_gb``) over the second half of the run (after allocator warm-up): a leak shows as
a positive slope in MiB/step.

Run: ``.venv/bin/python benchmarks/bench_scaling.py [--quick] [--smoke] [--steps 200]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()


def child(job: C.GRPOJob) -> dict:
    logger = C.run_hybridflow(job.overrides() + ["trainer.logger=[]"])
    steps = [m for _, _, m in logger.records if "timing_s/step" in m]
    return {"step_times": [m["timing_s/step"] for m in steps], "tokens": [m["perf/total_num_tokens"] for m in steps],
            "rss_mb": [m["perf/cpu_memory_used_gb"] * 1024 for m in steps], "peak_rss_mb": C.peak_rss_mb()}


IN_PROCESS = False  # --smoke: run points in this process (no interpreter start-up per point; RSS is shared)


def point(job: C.GRPOJob, warmup: int) -> dict:
    res = child(job) if IN_PROCESS else C.run_child(SCRIPT, ["--child", json.dumps(asdict(job))])
    times, toks = res["step_times"][warmup:], res["tokens"][warmup:]
    step = C.median(times)
    return {"step_s": step, "ms_per_token": 1000 * C.median([t / n for t, n in zip(times, toks)]),
            "peak_rss_mb": res["peak_rss_mb"], "rss_mb": res["rss_mb"]}


def axis(name: str, values: list, make_job, warmup: int) -> None:
    rows = []
    for v in values:
        r = point(make_job(v), warmup)
        rows.append([v, r["step_s"], r["ms_per_token"], r["peak_rss_mb"], C.machine_state()["load"].split()[0]])
    print(f"\n{name}")
    C.print_table([name, "median step s", "ms / token", "peak RSS MiB", "load (1 min)"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="one point per axis, few steps (CI smoke test)")
    p.add_argument("--steps", type=int, default=None, help="soak steps (default 200; 40 with --quick)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        data = json.loads(args.child)
        data["extra"] = tuple(data["extra"])
        C.emit_result(child(C.GRPOJob(**data)))
        return 0

    global IN_PROCESS
    IN_PROCESS = args.smoke
    work = C.DEFAULT_WORKDIR
    state = C.print_state("GRPO step scaling (hybridflow, local backend)")
    data = str(C.task_data(work))
    if args.smoke:
        batches, lengths, sizes, steps, warmup, soak = [2], [8], ["nano"], 3, 1, args.steps or 6
    elif args.quick:
        batches, lengths, sizes, steps, warmup, soak = [4, 8, 16], [8, 32, 64], ["nano", "tiny", "small"], 6, 2, args.steps or 40
    else:
        batches, lengths, sizes, steps, warmup, soak = ([4, 8, 16, 32], [8, 32, 64, 128],
                                                        ["nano", "tiny", "small", "medium"], 8, 2, args.steps or 200)
    base = C.GRPOJob(model=C.base_model(work, "nano" if args.smoke else "tiny"), data_dir=data, prompts=4, group=4,
                     response_length=32 if not args.smoke else 8, steps=steps)
    print(f"base job: {base.prompts} prompts x {base.group} samples, response length {base.response_length}, "
          f"model {Path(base.model).name}; load {state['load']}")
    axis("prompts per step (x4 samples)", batches, lambda v: replace(base, prompts=v), warmup)
    axis("response length", lengths, lambda v: replace(base, response_length=v), warmup)
    axis("model size", sizes, lambda v: replace(base, model=C.base_model(work, v)), warmup)

    soak_job = replace(base, steps=soak)
    r = point(soak_job, warmup)
    rss = r["rss_mb"]
    tail = rss[len(rss) // 2:]
    s = C.slope(tail)
    print(f"\nsoak: {soak} steps; RSS first {rss[0]:.1f} MiB, middle {rss[len(rss) // 2]:.1f} MiB, "
          f"last {rss[-1]:.1f} MiB, peak {r['peak_rss_mb']:.1f} MiB")
    print(f"rss_slope_mib_per_step={s:.4f}  (least squares over steps {len(rss) - len(tail) + 1}..{len(rss)}; "
          f"x1000 steps = {1000 * s:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
