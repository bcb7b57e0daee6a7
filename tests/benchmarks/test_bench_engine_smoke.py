"""Smoke tests of ``benchmarks/bench_rollout.py`` and ``benchmarks/bench_threads.py``: each runs end to end
and prints its headline numbers.  No threshold on them (timings are never asserted in tests); the rollout
engine's per-row lengths are asserted inside the script itself."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.slow


def _main(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"{name}_smoke", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_bench_rollout_smoke(capsys):
    assert _main("bench_rollout")(["--smoke"]) == 0
    out = capsys.readouterr().out
    for key in ("cpu_ratio_distinct", "ratio_distinct", "cpu_ratio", "ratio"):
        m = re.search(rf"^{key}=([0-9.]+)$", out, re.M)
        assert m and float(m.group(1)) > 0, f"{key}= missing from:\n{out[-1500:]}"
    assert "| grpo | hybridflow hf |" in out


def test_bench_threads_smoke():
    # A subprocess: its ranks are spawned processes that must import the script by its own name.
    proc = subprocess.run([sys.executable, str(BENCH / "bench_threads.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"^oversubscription_slowdown=([0-9.]+)$", out, re.M)
    assert m and float(m.group(1)) > 0, out[-1500:]
    assert "| per-worker | " in out and "| torch default | " in out
