"""The schedule arithmetic of benchmarks/gpu/bench_pipeline_gpu.py on cases with a known answer, and its CPU smoke."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_pipeline_gpu_under_test", GPU / "bench_pipeline_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 2), (2, 1)])
def test_equal_stages_without_transfers_have_the_textbook_bubble(bench, schedule, pp, m):
    step = bench.simulate(schedule, pp, m, 1.0, 2.0, 0.0)
    assert step == pytest.approx((m + pp - 1) * 3.0)
    assert 1 - m * 3.0 / step == pytest.approx((pp - 1) / (m + pp - 1))


def test_transfers_lengthen_the_critical_path_once_per_hop_each_way(bench):
    # pp 2, m 1: F0, send, F1, B1, send, B0
    assert bench.simulate("1f1b", 2, 1, 1.0, 2.0, 0.5) == pytest.approx(1 + 0.5 + 1 + 2 + 0.5 + 2)


def test_1f1b_keeps_the_warm_up_order(bench):
    assert bench._order("1f1b", 4, 6, 0)[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert bench._order("1f1b", 4, 6, 3)[:4] == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


def test_cpu_smoke_prints_both_schedules(bench, capsys):
    assert bench.main(["--cpu-smoke", "--pp", "2", "--tp", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 1 |" in out and "json=" in out
