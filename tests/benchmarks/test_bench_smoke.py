"""Smoke test of the benchmark scripts: each one's smallest configuration runs end to end and prints its
headline number. Not a performance test (no thresholds on timings): it keeps the scripts from rotting as
the framework's APIs move. Marked ``slow`` (deselect with ``-m "not slow"``); ``make test`` runs it.

The scripts run in this process (``main(["--smoke"])``) to skip an interpreter start-up per script; only
``bench_startup`` launches its own subprocess, which is what it measures.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.slow


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}_smoke", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name: str, capsys) -> str:
    assert _load(name).main(["--smoke"]) == 0
    return capsys.readouterr().out


def _number(out: str, key: str) -> float:
    m = re.search(rf"^{re.escape(key)}=([0-9.]+)", out, re.M)
    assert m, f"{key}= missing from the output:\n{out[-2000:]}"
    return float(m.group(1))


def test_bench_vs_trl_smoke(capsys):
    pytest.importorskip("trl", reason="bench_vs_trl needs TRL (pip install trl, with the torch pin)")
    out = _run("bench_vs_trl", capsys)
    assert _number(out, "ratio_step_time") > 0
    assert out.rstrip().splitlines()[-1].startswith("ratio_step_time=")


def test_bench_vs_trl_generation_smoke(capsys):
    pytest.importorskip("trl", reason="bench_vs_trl needs TRL (pip install trl, with the torch pin)")
    assert _load("bench_vs_trl").main(["--shape", "generation", "--smoke"]) == 0
    out = capsys.readouterr().out
    assert _number(out, "ratio_step_time_generation") > 0
    assert "| hybridflow_dynbsz |" in out and "| trl |" in out
    last = out.rstrip().splitlines()[-1]
    assert re.match(r"accuracy_delta_generation=[+-][0-9.]+", last), last


def test_bench_train_smoke(capsys):
    out = _run("bench_train", capsys)
    assert 0 < _number(out, "mfu_packed")
    assert _number(out, "padding_cost") > 0


def test_bench_sequence_parallel_smoke(capsys):
    out = _run("bench_sequence_parallel", capsys)
    assert "| 2 | 2 | 128 |" in out  # sp=2: two processes, half the tokens each
    assert 0 < _number(out, "saved_ratio_sp2") < 0.9  # the activations kept per rank shrink


def test_bench_scaling_smoke(capsys):
    out = _run("bench_scaling", capsys)
    assert "| model size |" in out
    assert re.search(r"^rss_slope_mib_per_step=-?[0-9.]+", out, re.M)


def test_bench_startup_smoke(capsys):
    out = _run("bench_startup", capsys)
    assert 0 < _number(out, "startup_first_token_local_s") < 120


def test_bench_rollout_smoke(capsys):
    out = _run("bench_rollout", capsys)
    for key in ("cpu_ratio_distinct", "ratio_distinct", "cpu_ratio", "ratio"):
        assert _number(out, key) > 0
    assert "| grpo | hybridflow hf |" in out


def test_bench_threads_smoke():
    # A subprocess: its ranks are spawned processes that must import the script by its own name.
    proc = subprocess.run([sys.executable, str(BENCH / "bench_threads.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _number(proc.stdout, "oversubscription_slowdown") > 0
    assert "| per-worker | " in proc.stdout and "| torch default | " in proc.stdout


def test_bench_cores_smoke(capsys):
    out = _run("bench_cores", capsys)
    assert "| local_default | 1 |" in out and "| local_1thread | 1 |" in out
    assert re.search(r"^nano: best=local_\w+ default_vs_best=[0-9.]+$", out, re.M)


def test_bench_kv_cache_smoke(capsys):
    out = _run("bench_kv_cache", capsys)
    assert 0 < _number(out, "kv_bytes_ratio_bfloat16") < _number(out, "kv_bytes_ratio_float32") < 1


def test_bench_prefix_reuse_smoke(capsys):
    out = _run("bench_prefix_reuse", capsys)
    assert "same_tokens=True" in out and 0 < _number(out, "prefill_saving") < 1


def test_bench_async_smoke(capsys):
    out = _run("bench_async", capsys)
    assert _number(out, "ratio_samples_per_s") > 0 and "accuracy_delta=" in out


def test_grpo_reference_loop_runs_from_a_model_folder(tmp_path, capsys):
    """The reference GRPO loop (the learning-quality oracle of the quickstart) runs from an HF folder."""
    from hybridflow.quickstart.addition import build_base_model

    model = build_base_model(tmp_path / "base", seed=1)
    result = _load("grpo_reference").main(["--model", model, "--steps", "2", "--prompts", "4", "--n", "2",
                                            "--eval-every", "1", "--temperature", "0.5"])
    steps = [rec["step"] for rec in result["history"]]
    assert steps == [0, 1, 2] and all("acc" in rec and "p_right" in rec for rec in result["history"])
    assert all("grad_norm" in rec and "entropy" in rec for rec in result["history"][1:])


def test_bench_agent_loop_smoke(capsys):
    out = _run("bench_agent_loop", capsys)
    for key in ("ratio", "cpu_ratio", "ratio_no_prefix", "cpu_ratio_no_prefix"):
        assert _number(out, key) > 0
    # 4 trajectories x 3 turns: with prefix caching the later turns reuse their history, without it none is
    on = re.search(r"^\| 3-turn agent loop \| on \| 48 \| (\d+) \| (\d+) \|", out, re.M)
    off = re.search(r"^\| 3-turn agent loop \| off \| 48 \| (\d+) \| 0 \|", out, re.M)
    assert on and off and int(on.group(2)) > 0 and int(on.group(1)) < int(off.group(1))


def test_bench_pipeline_smoke(capsys):
    out = _run("bench_pipeline", capsys)
    assert "| 1f1b | 2 |" in out and "| gpipe | 4 |" in out
    assert 0 < _number(out, "bubble_1f1b_m2") < 1  # the pipeline ran and was measured against one process


def test_bench_hybrid_switch_smoke(tmp_path):
    """The switch against the all-gather on 4 processes (nano model): the split rollout holds half the weights and
    receives what its rank lacked, from a tp 2 x dp 2 actor (in place) and a pipeline one."""
    import json

    proc = subprocess.run([sys.executable, str(BENCH / "bench_hybrid_switch.py"), "--smoke", "--layouts", "tp2,pp2",
                           "--rollout-tps", "1,2", "--workdir", str(tmp_path)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.rstrip().splitlines()[-1])["rows"]
    split = [r for r in rows if r["tp_r"] == 2]
    assert all(r["switch"]["held_mib"] < 0.6 * r["gather"]["held_mib"] for r in split)
    assert all(abs(r["switch"]["recv_mib"] - r["redundancy_mib"]) < 1e-9 for r in rows if not r["in_place"])
    assert [r["in_place"] for r in split] == [True, False]


def test_gpu_hybrid_switch_script_runs_on_cpu(tmp_path):
    """benchmarks/gpu/bench_hybrid_switch_gpu.py --cpu-smoke: the GPU script's code path (tp 4 -> tp 2, 4 ranks)."""
    proc = subprocess.run([sys.executable, str(BENCH / "gpu" / "bench_hybrid_switch_gpu.py"), "--cpu-smoke", "--out",
                           str(tmp_path / "switch")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| switch |" in proc.stdout and "| gather |" in proc.stdout
