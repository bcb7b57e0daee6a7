"""Time from command to the first rollout token, Ray and local backends (spec S15; goal <= 10 s with Ray).

Runs ``python -m hybridflow.trainer.main_ppo`` with tiny settings as a subprocess (what a user types) and
reads its console output line by line as it arrives (unbuffered). The trainer's first step starts with
generation, so the first rollout token is produced at ``t(step:1 line) - timing_s/step`` plus the prompt's
prefill (a few milliseconds at this size): that is the number reported. The run is one step without
validation, so nothing else sits between start-up and the first rollout. ``import`` is the time of
``python -c "import hybridflow.trainer.main_ppo, torch, transformers"`` alone, for the breakdown.

Backends alternate (local, ray, ray, local, ...); medians are reported.

Run: ``.venv/bin/python benchmarks/bench_startup.py [--quick] [--smoke]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

STEP_LINE = re.compile(r"^step:1 ")


def _metric(line: str, key: str) -> float:
    m = re.search(re.escape(key) + r":([-0-9.e+]+)", line)
    if m is None:
        raise RuntimeError(f"the step line lacks {key}: {line[:300]}")
    return float(m.group(1))


def launch(backend: str, model: str, data: Path, timeout: float = 300) -> dict[str, float]:
    """Seconds from ``Popen`` to the first rollout token and to the end of step 1."""
    job = C.GRPOJob(model=model, data_dir=str(data), prompts=4, group=4, response_length=8, steps=1,
                    backend=backend)
    cmd = [sys.executable, "-u", "-m", "hybridflow.trainer.main_ppo", *job.overrides(), "trainer.logger=[console]"]
    env = C.single_thread_env()
    env["PYTHONUNBUFFERED"] = "1"
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=C.REPO)
    out: list[str] = []
    result = None
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if result is None and STEP_LINE.match(line):
            t_line = time.perf_counter() - start
            result = {"first_token_s": t_line - _metric(line, "timing_s/step"), "first_step_s": t_line}
        if time.perf_counter() - start > timeout:
            proc.kill()
            break
    rc = proc.wait()
    result_total = time.perf_counter() - start
    if result is None or rc != 0:
        raise RuntimeError(f"main_ppo ({backend}) exited rc={rc} without a step:1 line:\n{''.join(out[-40:])}")
    result["exit_s"] = result_total
    return result


def import_time() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import hybridflow.trainer.main_ppo, torch, transformers"], check=True,
                   env=C.single_thread_env(), cwd=C.REPO)
    return time.perf_counter() - start


RAY_INIT = ("import time, ray; t = time.perf_counter(); ray.init(include_dashboard=False, num_cpus=2); "
            "print(f'RAYINIT {time.perf_counter() - t:.3f}'); ray.shutdown()")


def ray_init_time() -> float:
    """``ray.init`` of a lean local instance alone (the Ray row's fixed cost before any worker exists)."""
    out = subprocess.run([sys.executable, "-c", RAY_INIT], capture_output=True, text=True, check=True,
                         env=C.single_thread_env(), cwd=C.REPO).stdout
    return float(out.split("RAYINIT")[1].split()[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="local backend once (CI smoke test)")
    args = p.parse_args(argv)
    work = C.DEFAULT_WORKDIR
    state = C.print_state("start-up: command -> first rollout token")
    model, data = C.base_model(work, "tiny"), C.task_data(work)
    backends = ["local"] if args.smoke else ["local", "ray"]
    reps = 1 if args.smoke else 2 if args.quick else 4
    runs: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    imports: list[float] = []
    ray_inits: list[float] = []
    for rep in range(reps):
        if not args.smoke:
            imports.append(import_time())
            ray_inits.append(ray_init_time())
        for b in (backends if rep % 2 == 0 else backends[::-1]):
            r = launch(b, model, data)
            runs[b].append(r)
            print(f"  rep {rep} {b:5s} first token {r['first_token_s']:.2f}s  step 1 done {r['first_step_s']:.2f}s  "
                  f"exit {r['exit_s']:.2f}s  load {os.getloadavg()[0]:.2f}", flush=True)
    alone = f"{C.median(imports):.2f}s" if imports else "not measured"
    rinit = f"{C.median(ray_inits):.2f}s" if ray_inits else "not measured"
    print(f"\nmedian of {reps} runs each (load at start {state['load']}); python+imports alone {alone}; "
          f"ray.init alone {rinit}")
    rows = [[b, C.median([r["first_token_s"] for r in rs]), C.median([r["first_step_s"] for r in rs]),
             C.median([r["exit_s"] for r in rs])] for b, rs in runs.items()]
    C.print_table(["backend", "command -> first rollout token s", "-> step 1 done s", "-> process exit s"], rows)
    for b, first, *_ in rows:
        print(f"startup_first_token_{b}_s={first:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
