"""Smoke test of ``benchmarks/bench_rollout.py``: both workloads run end to end and print their ratios.
No threshold on the ratios (timings are never asserted in tests); the engine's correctness under the
benchmark's per-row lengths is asserted inside the script itself."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.slow


def test_bench_rollout_smoke(capsys):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_rollout_smoke", BENCH / "bench_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    for key in ("cpu_ratio_distinct", "ratio_distinct", "cpu_ratio", "ratio"):
        m = re.search(rf"^{key}=([0-9.]+)$", out, re.M)
        assert m and float(m.group(1)) > 0, f"{key}= missing from:\n{out[-1500:]}"
    assert "| grpo | hybridflow hf |" in out
