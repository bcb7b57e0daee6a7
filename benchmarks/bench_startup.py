"""Time from command to the first rollout token, Ray and local backends (spec S15; goal <= 10 s with Ray).

Runs ``python -m hybridflow.trainer.main_ppo`` with tiny settings as a subprocess (what a user types) and
reads its console output line by line as it arrives (unbuffered). The trainer's first step starts with
generation, so the first rollout token is produced at ``t(step:1 line) - timing_s/step`` plus the prompt's
prefill (a few milliseconds at this size): that is the number reported. The run is one step without
validation, so nothing else sits between start-up and the first rollout. ``import`` is the time of
``python -c "import hybridflow.trainer.main_ppo, torch, transformers"`` alone, for the breakdown.

Rows alternate (local, ray, ray_attached, ..., then reversed); medians are reported. ``ray`` starts a fresh
local Ray instance inside the run; ``ray_attached`` runs with ``RAY_ADDRESS`` pointing at a head this script
started once with ``ray start --head --block`` in its own temp dir (the way a verl user runs jobs on an
existing cluster), stopped at the end by signalling that one process (never ``ray stop``, which would kill
every Ray instance on the machine). ``--baseline-repo DIR`` adds the same rows run from another checkout
(``git worktree add DIR REV``), for a before/after measured side by side.

Run: ``.venv/bin/python benchmarks/bench_startup.py [--quick] [--smoke] [--baseline-repo DIR]``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
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


def launch(backend: str, model: str, data: Path, timeout: float = 300, repo: Path = C.REPO,
           ray_address: str | None = None) -> dict[str, float]:
    """Seconds from ``Popen`` to the first rollout token and to the end of step 1.

    ``backend`` is ``local`` or ``ray``; ``ray_address`` (exported as ``RAY_ADDRESS``) makes the Ray run
    attach to that cluster; ``repo`` is the checkout whose code runs.
    """
    job = C.GRPOJob(model=model, data_dir=str(data), prompts=4, group=4, response_length=8, steps=1,
                    backend=backend)
    cmd = [sys.executable, "-u", "-m", "hybridflow.trainer.main_ppo", *job.overrides(), "trainer.logger=[console]"]
    env = C.single_thread_env()
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.pop("RAY_ADDRESS", None)
    if ray_address is not None:  # `ray start` clusters use token auth (token in ~/.ray/auth_token)
        env.update(RAY_ADDRESS=ray_address, RAY_AUTH_MODE="token")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=repo)
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RayHead:
    """``ray start --head --block`` in a private temp dir; ``stop()`` signals that process only.

    The private ``--temp-dir`` keeps it out of ``/tmp/ray/ray_current_cluster``, so nobody else's bare
    ``ray.init()`` on this machine joins it; ``--block`` makes the ``ray start`` process own the cluster, so
    terminating it stops this cluster and no other.
    """

    def __init__(self, workdir: Path, num_cpus: int = 2, timeout_s: float = 120.0):
        ray_bin = Path(sys.executable).with_name("ray")
        self.temp_dir = workdir / "ray_head"
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.address = f"127.0.0.1:{_free_port()}"
        port = self.address.rsplit(":", 1)[1]
        self.log = open(workdir / "ray_head.log", "w")
        self.proc = subprocess.Popen(
            [str(ray_bin), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={num_cpus}",
             "--include-dashboard=false",
             f"--temp-dir={self.temp_dir}", "--block", "--disable-usage-stats"],
            stdout=self.log, stderr=subprocess.STDOUT, env=C.single_thread_env(), start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # up when a one-line driver can connect
            try:
                probe = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={self.address!r})"],
                                       capture_output=True, text=True, env=dict(C.single_thread_env(), RAY_AUTH_MODE="token"),
                                       timeout=60)
            except subprocess.TimeoutExpired:
                continue
            if probe.returncode == 0:
                return
            self.last_error = probe.stderr[-1500:]
            if self.proc.poll() is not None:
                break
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"`ray start --head` did not come up in {timeout_s:.0f}s; see {workdir / 'ray_head.log'}; "
                           f"last connection attempt: {getattr(self, 'last_error', 'none finished')}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="local backend once (CI smoke test)")
    p.add_argument("--baseline-repo", type=Path, default=None,
                   help="another checkout (git worktree) whose code also runs every row, for before/after")
    p.add_argument("--rows", default="local,ray,ray_attached", help="comma-separated subset of the rows")
    args = p.parse_args(argv)
    work = C.DEFAULT_WORKDIR
    state = C.print_state("start-up: command -> first rollout token")
    model, data = C.base_model(work, "tiny"), C.task_data(work)
    rows = ["local"] if args.smoke else args.rows.split(",")
    variants = [(r, "", C.REPO) for r in rows]
    if args.baseline_repo is not None:
        variants += [(r, " (baseline)", args.baseline_repo.resolve()) for r in rows]
    reps = 1 if args.smoke else 2 if args.quick else 4
    runs: dict[str, list[dict[str, float]]] = {row + tag: [] for row, tag, _ in variants}
    imports: list[float] = []
    ray_inits: list[float] = []
    head = RayHead(work) if "ray_attached" in rows else None
    try:
        for rep in range(reps):
            if not args.smoke:
                imports.append(import_time())
                ray_inits.append(ray_init_time())
            for row, tag, repo in (variants if rep % 2 == 0 else variants[::-1]):
                backend = "local" if row == "local" else "ray"
                r = launch(backend, model, data, repo=repo, ray_address=head.address if row == "ray_attached" else None)
                runs[row + tag].append(r)
                print(f"  rep {rep} {row + tag:24s} first token {r['first_token_s']:.2f}s  "
                      f"step 1 done {r['first_step_s']:.2f}s  exit {r['exit_s']:.2f}s  load {os.getloadavg()[0]:.2f}",
                      flush=True)
    finally:
        if head is not None:
            head.stop()
    alone = f"{C.median(imports):.2f}s" if imports else "not measured"
    rinit = f"{C.median(ray_inits):.2f}s" if ray_inits else "not measured"
    print(f"\nmedian of {reps} runs each (load at start {state['load']}, at end {os.getloadavg()[0]:.2f}); "
          f"python+imports alone {alone}; ray.init alone {rinit}")
    table = [[b, C.median([r["first_token_s"] for r in rs]), C.median([r["first_step_s"] for r in rs]),
              C.median([r["exit_s"] for r in rs])] for b, rs in runs.items()]
    C.print_table(["row", "command -> first rollout token s", "-> step 1 done s", "-> process exit s"], table)
    for b, first, *_ in table:
        print(f"startup_first_token_{b.replace(' (baseline)', '_baseline')}_s={first:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
