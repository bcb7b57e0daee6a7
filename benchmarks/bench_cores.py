"""Using both cores from a single-GPU-style command line: 1 rank x 2 threads vs 2 ranks x 1 thread vs the
default (issue 16 item 4).

verl's single-GPU command lines say ``trainer.n_gpus_per_node=1``; on a CPU machine that is one worker process,
and the question is how it should use the machine's cores. Each variant runs the same GRPO job (the full step:
rollout, reward, advantages, actor update) in a fresh process, alternating, and reports the median step time
after warm-up with its generation and update stages:

* ``ray_default`` -- ``trainer.backend=ray, n_gpus_per_node=1`` as shipped: the trainer gives the one worker
  the node's cores as torch threads (``launch.cpu_threads.cpu_threads_per_process``);
* ``ray_1x1`` -- the same with ``OMP_NUM_THREADS=1`` in the environment: one thread (the default before);
* ``ray_2x1`` -- ``n_gpus_per_node=2``: two FSDP ranks of one thread each (gloo all-reduce, half the rows each);
* ``local_default`` -- ``trainer.backend=local``: the driver process with torch's default thread count;
* ``local_1thread`` -- the local backend with ``OMP_NUM_THREADS=1``.

Children run without ``OMP_NUM_THREADS`` (except ``local_1thread``), as a user's shell would. Two jobs: the
overhead-bound ``tiny`` model (0.4 M parameters, 16 prompts x 8 x 8 tokens: the quickstart's shape) and the
arithmetic-bound ``medium`` one (~18 M, 8 prompts x 4 x 32 tokens). The last lines print, per job,
``best=<variant>`` and ``default_vs_best=<ray_default / best>`` (1.0 when the default is the best).

    python benchmarks/bench_cores.py [--quick] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()
VARIANTS: dict[str, tuple[str, int, tuple[str, ...], dict[str, str]]] = {
    # name: (backend, ranks, extra overrides, extra env)
    "ray_default": ("ray", 1, (), {}),
    "ray_1x1": ("ray", 1, (), {"OMP_NUM_THREADS": "1"}),
    "ray_2x1": ("ray", 2, (), {}),
    "local_default": ("local", 1, (), {}),
    "local_1thread": ("local", 1, (), {"OMP_NUM_THREADS": "1"}),
}


def child(job: C.GRPOJob) -> dict:
    logger = C.run_hybridflow(job.overrides() + ["trainer.logger=[]"])
    steps = [m for _, _, m in logger.records if "timing_s/step" in m]
    pick = lambda key: [m.get(key, 0.0) for m in steps]  # noqa: E731
    return {"step": pick("timing_s/step"), "gen": pick("timing_s/gen"), "update": pick("timing_s/update_actor")}


def job_for(variant: str, base: C.GRPOJob) -> tuple[C.GRPOJob, dict[str, str]]:
    backend, ranks, extra, env = VARIANTS[variant]
    micro = base.prompts * base.group // ranks
    a = "actor_rollout_ref"
    overrides = (f"trainer.n_gpus_per_node={ranks}", f"{a}.actor.ppo_micro_batch_size_per_gpu={micro}",
                 f"{a}.rollout.log_prob_micro_batch_size_per_gpu={micro}", *extra)
    return replace(base, backend=backend, extra=base.extra + overrides), env


def run(variant: str, base: C.GRPOJob) -> dict:
    job, extra_env = job_for(variant, base)
    env = C.single_thread_env()
    env.pop("OMP_NUM_THREADS", None)  # as a user's shell: the framework chooses
    env.update(extra_env)
    return C.run_child(SCRIPT, ["--child", json.dumps(asdict(job))], timeout=1800, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps, one round (~10 min)")
    p.add_argument("--smoke", action="store_true", help="nano model, local variants only, 2 steps (CI)")
    p.add_argument("--job", choices=["tiny", "medium", "medium128", "all"], default="all",
                   help="which job(s) to run (medium128: issue 36's shape, 128-token responses; not in all)")
    p.add_argument("--variants", default=None, help="comma-separated subset of the variants (default: all)")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds (default: 2, quick 1)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        C.emit_result(child(C.job_from_json(args.child)))
        return 0
    work = C.DEFAULT_WORKDIR
    state = C.print_state(f"bench_cores: 1 rank x {os.cpu_count()} threads vs ranks x 1 thread vs the default")
    data = str(C.task_data(work))
    if args.smoke:
        jobs = {"nano": C.GRPOJob(model=C.base_model(work, "nano"), data_dir=data, prompts=2, group=2,
                                  response_length=4, steps=2)}
        variants, rounds, warmup = ["local_default", "local_1thread"], 1, 1
    else:
        steps = (12, 5) if args.quick else (24, 8)
        jobs = {"tiny": C.GRPOJob(model=C.base_model(work, "tiny"), data_dir=data, prompts=16, group=8,
                                  response_length=8, steps=steps[0]),
                "medium": C.GRPOJob(model=C.base_model(work, "medium"), data_dir=data, prompts=8, group=4,
                                    response_length=32, steps=steps[1]),
                "medium128": C.GRPOJob(model=C.base_model(work, "medium"), data_dir=data, prompts=8, group=4,
                                       response_length=128, steps=steps[1])}
        jobs = {k: v for k, v in jobs.items() if args.job == k or (args.job == "all" and k != "medium128")}
        variants = args.variants.split(",") if args.variants else list(VARIANTS)
        unknown = [v for v in variants if v not in VARIANTS]
        if unknown:
            p.error(f"--variants: unknown {unknown}; choose from {list(VARIANTS)}")
        rounds, warmup = args.rounds or (1 if args.quick else 2), 2
    summary = []
    for name, base in jobs.items():
        res: dict[str, dict[str, list[float]]] = {v: {"step": [], "gen": [], "update": []} for v in variants}
        for r in range(rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                out = run(v, base)
                for k in res[v]:
                    res[v][k] += out[k][warmup:]
                print(f"  {name} round {r} {v:14s} median step {C.median(out['step'][warmup:]):.3f}s  "
                      f"load {C.machine_state()['load']}", flush=True)
        rows = [[v, VARIANTS[v][1], C.median(r["step"]), C.median(r["gen"]), C.median(r["update"])]
                for v, r in res.items()]
        best = min(rows, key=lambda row: row[2])
        default = next((row for row in rows if row[0] == "ray_default"), rows[0])
        print(f"\n{name}: {base.prompts} prompts x {base.group} x {base.response_length} tokens "
              f"(load {state['load']} at start)")
        C.print_table(["variant", "ranks", "median step s", "gen s", "update_actor s", "vs best"],
                      [row + [row[2] / best[2]] for row in rows])
        summary.append((name, best[0], default[2] / best[2]))
    for name, best, ratio in summary:
        print(f"{name}: best={best} default_vs_best={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
