"""The one launcher of the multi-rank scenarios: ``world`` processes of a script on gloo, each writing its own log.

A scenario script is called as ``python SCRIPT RANK WORLD PORT ARGS...`` with this repository and tests/ first on the
path (as pytest's ``pythonpath``: a script imports the tests' helpers by the same names) and one torch thread per rank; :func:`run_ranks` waits for every rank (at most ``timeout`` seconds, then kills them all)
and, when one failed, raises with the log of the rank that failed first for its own reason (the others usually
wait in a collective and time out).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["exit_rank", "free_port", "run_ranks"]

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path, world: int, args: list[str], log_dir: Path, timeout: float = 600,
              env: dict[str, str] | None = None) -> list[str]:
    """Run ``script`` on ``world`` ranks; returns each rank's log. Raises ``AssertionError`` naming the rank that
    failed (and ``subprocess.TimeoutExpired`` after killing every rank when they outlive ``timeout``)."""
    port = str(free_port())
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1",
               **(env or {})}
    log_dir.mkdir(parents=True, exist_ok=True)
    paths = [log_dir / f"rank{r}.log" for r in range(world)]
    # each rank writes to its own file: a pipe read one rank at a time would block the others once full
    files = [open(p, "w") for p in paths]
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), port, *map(str, args)], env=environ,
                              stdout=f, stderr=subprocess.STDOUT, text=True) for r, f in enumerate(files)]
    try:
        for p in procs:
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for q in procs:
            q.kill()
        raise
    finally:
        for f in files:
            f.close()
    logs = [p.read_text() for p in paths]
    failed = [(r, log) for r, (p, log) in enumerate(zip(procs, logs)) if p.returncode != 0]
    if failed:
        r, log = next(((r, log) for r, log in failed if "Timed out" not in log), failed[0])
        raise AssertionError(f"rank {r} of world {world} ({Path(script).name}) failed:\n{log[-6000:]}")
    return logs


def exit_rank(code: int = 0) -> None:
    """End a scenario rank: every rank past its last collective (a barrier), the process group destroyed, output
    flushed, then the process ends without interpreter finalisation. A rank that destroyed its group and returned
    normally was seen dying of ``terminate called without an active exception`` (SIGABRT, after printing its result)
    while its peer was still tearing down: gloo's worker threads meeting a half-finalised interpreter."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

