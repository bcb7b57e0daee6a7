"""Per isolation mode: the cost of one sandboxed run, and how the two process-level bombs end.

* overhead: wall time of ``print(1)`` (median and p90 of ``--runs`` sequential runs), and runs/s with 8 threads;
* memory bomb over forks: 6 children each touching 130 MiB under ``memory_mb=256`` (issue 24's +2.4 GB case):
  the status, the peak the watchdog saw (MiB summed over processes) and the wall time until the kill;
* fork bomb under ``max_processes=16``: the status, what stopped it, and the wall time.

Run: ``.venv/bin/python benchmarks/sandbox_modes.py [--runs 20]`` (modes this machine does not offer are left out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybridflow.sandbox import SandboxConfig, available_isolations, run_python  # noqa: E402

MEMORY_BOMB = textwrap.dedent("""
    import os, time
    for _ in range(6):
        try:
            if os.fork() == 0:
                block = bytearray(130 * 1024 * 1024)
                time.sleep(30)
                os._exit(0)
        except (OSError, PermissionError) as e:
            print("fork refused", type(e).__name__, flush=True)
            raise SystemExit(3)
    time.sleep(30)
""")
FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def measure(mode: str, runs: int) -> dict:
    cfg = SandboxConfig(isolation=mode, timeout_s=10.0, memory_mb=256)
    walls = [run_python("print(1)", config=cfg).wall_s for _ in range(runs)]
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: run_python("print(1)", config=cfg), range(4 * runs)))
    rate = 4 * runs / (time.perf_counter() - start)
    mem = run_python(MEMORY_BOMB, config=SandboxConfig(isolation=mode, timeout_s=20.0, memory_mb=256,
                                                       max_processes=16))
    bomb = run_python(FORK_BOMB, config=SandboxConfig(isolation=mode, timeout_s=3.0, max_processes=16))
    note = bomb.stderr.strip().splitlines()[-1:] or [""]
    return {
        "mode": mode,
        "print(1) median_s": round(statistics.median(walls), 3),
        "print(1) p90_s": round(sorted(walls)[int(0.9 * (len(walls) - 1))], 3),
        "runs_per_s_8_threads": round(rate, 1),
        "memory_bomb": {"status": mem.status, "peak_mb": mem.peak_memory_mb, "wall_s": round(mem.wall_s, 2)},
        "fork_bomb": {"status": bomb.status, "wall_s": round(bomb.wall_s, 2),
                      "stopped_by": note[0] if "sandbox:" in note[0] else "kernel process limit, then the time limit"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    for mode in available_isolations():
        print(json.dumps(measure(mode, args.runs)), flush=True)


if __name__ == "__main__":
    main()
