"""Exact on-policy log-probs: a GRPO step with them (the default) vs without, side by side (issue 36 item 3).

Two rows per shape, runs interleaved (AB, BA, ...), every run a fresh process through the real path (local backend,
``RLController``, hf rollout, actor update):

* ``exact`` -- the defaults: ``rollout.exact_log_probs`` null -> on (hf, CPU fp32): MKL's strict mode in the
  process, batch-invariant attention / RMSNorm / SiLU in the rollout and the actor, the rollout's log-probs are pi_old;
* ``torch_kernels`` -- ``exact_log_probs=false`` and ``HYBRIDFLOW_STRICT_MATMUL=0``: torch's own kernels, MKL's
  default mode, the oneDNN-packed decode; ``calculate_log_probs=true`` as well, so with one mini-batch both rows take
  pi_old from the rollout and the ratio is the kernels' cost alone; with two mini-batches this row runs the
  ``old_log_prob`` pass that exactness makes unnecessary.

Shapes: ``step`` (the per-step overhead shape of ``bench_vs_trl.py --shape step``: ~1M-parameter Qwen2, 16 prompts x 8,
4-token answers, 1 thread, one mini-batch) and ``decode`` (the ``small`` ~3M Qwen2, random init, 8 prompts x 4,
64-token responses, 2 threads, 2 mini-batches: decode- and update-heavy). Printed: median step seconds (wall and CPU)
after the warm-up, the stages, and ``ratio_exact_vs_torch_kernels_<shape>=...``.
Run: ``.venv/bin/python benchmarks/bench_exact.py [--quick] [--shapes step,decode]``.
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
A = "actor_rollout_ref"
ROWS = {
    "exact": ((), {}),
    "torch_kernels": ((f"{A}.rollout.exact_log_probs=false", f"{A}.rollout.calculate_log_probs=true"),
                      {"HYBRIDFLOW_STRICT_MATMUL": "0", "MKL_CBWR": "AUTO"}),
}


def _job(shape: str, steps: int) -> tuple[C.GRPOJob, int]:
    work = C.DEFAULT_WORKDIR
    data = str(C.task_data(work))
    if shape == "step":
        import bench_vs_trl

        return C.GRPOJob(model=bench_vs_trl.step_model(work), data_dir=data, prompts=16, group=8, response_length=4,
                         prompt_length=8, lr=5e-5, steps=steps), 1
    job = C.GRPOJob(model=C.base_model(work, "small"), data_dir=data, prompts=8, group=4, response_length=64,
                    prompt_length=8, lr=5e-5, steps=steps,
                    extra=(f"{A}.actor.ppo_mini_batch_size=4", f"{A}.rollout.ignore_eos=true"))
    return job, 2


def child(job_json: str) -> None:
    import bench_vs_trl

    from hybridflow.engine.batch_invariant import strict_matmul

    result = bench_vs_trl.child_hybridflow(C.job_from_json(job_json), None)
    result["strict_matmul"] = strict_matmul()
    print("RESULT " + json.dumps(result), flush=True)


def _run(job: C.GRPOJob, row: str, threads: int) -> dict:
    extra, env = ROWS[row]
    environ = {**C.single_thread_env(threads), **env}
    if not env:
        environ.pop("MKL_CBWR", None)  # the package's default (strict) applies
        environ.pop("HYBRIDFLOW_STRICT_MATMUL", None)
    job = replace(job, extra=job.extra + extra)
    return C.run_child(SCRIPT, ["--child", json.dumps(asdict(job))], timeout=3600, env=environ)


def measure(shape: str, reps: int, steps: int, warmup: int) -> dict:
    job, threads = _job(shape, steps)
    acc = {row: {"wall": [], "cpu": [], "stages": [], "strict": None} for row in ROWS}
    for rep in range(reps):
        for row in (list(ROWS) if rep % 2 == 0 else list(ROWS)[::-1]):
            res = _run(job, row, threads)
            acc[row]["wall"] += res["step_times"][warmup:]
            acc[row]["cpu"] += res["cpu_times"][warmup:]
            acc[row]["stages"].append(res["stages"])
            acc[row]["strict"] = res["strict_matmul"]
            print(f"  {shape} rep {rep} {row:14s} median step {C.median(res['step_times'][warmup:]):.3f}s  "
                  f"load {C.machine_state()['load']}", flush=True)
    rows = []
    for row, v in acc.items():
        stages = {k: C.median([s[k] for s in v["stages"] if k in s]) for k in v["stages"][-1]}
        rows.append([row, C.median(v["wall"]), C.median(v["cpu"]) if v["cpu"] else float("nan"), v["strict"],
                     "  ".join(f"{k} {t:.3f}" for k, t in sorted(stages.items()) if k != "step" and "/" not in k)])
    C.print_table(["row", "median step s (wall)", "median CPU s", "MKL strict", "stages (median s)"], rows)
    ratio = C.median(acc["exact"]["wall"]) / C.median(acc["torch_kernels"]["wall"])
    cpu = C.median(acc["exact"]["cpu"]) / C.median(acc["torch_kernels"]["cpu"]) if acc["exact"]["cpu"] else float("nan")
    print(f"ratio_exact_vs_torch_kernels_{shape}={ratio:.3f} (CPU {cpu:.3f})", flush=True)
    return {"wall": ratio, "cpu": cpu}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="2 interleaved runs of 6 steps per row")
    p.add_argument("--shapes", default="step,decode")
    args = p.parse_args()
    if args.child:
        child(args.child)
        return 0
    reps, steps, warmup = (2, 6, 2) if args.quick else (4, 10, 3)
    for shape in args.shapes.split(","):
        C.print_state(f"exact on-policy log-probs vs torch's kernels, shape {shape}")
        measure(shape, reps, steps, warmup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
