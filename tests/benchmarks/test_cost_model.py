"""Known answers of the RL-step cost model (benchmarks/cost_model.py, issue 36 item 4)."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _module():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("hf_bench_cost_model", BENCH / "cost_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve their annotations through it
    spec.loader.exec_module(mod)
    return mod


CM = _module()
LLAMA2_7B = CM.Shape("Llama-2-7B", layers=32, hidden=4096, intermediate=11008, heads=32, kv_heads=32, vocab=32000)
FLAT = CM.Device("flat", train_flops=1e9, fwd_flops=2e9, decode_t0=0.01, decode_t1=0.0, mem_bw=math.inf,
                 decode_flops=math.inf, link_bw=1e8, optimizer_s_per_param=1e-9, step_overhead_s=0.5)
TINY = CM.Shape("tiny", layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=100, bytes_per_param=4)


def test_the_pipeline_bubble_is_the_textbook_formula():
    assert CM.bubble(1, 8) == 0.0
    assert CM.bubble(2, 8) == pytest.approx(1 / 9)
    assert CM.bubble(4, 8) == pytest.approx(3 / 11)


def test_switch_bytes_match_the_measured_7b_switch():
    """RESULTS.md section 23: a 7B-shaped Llama, training tp 4 -> rollout tp 2: the switch received 3.14 GiB per
    rank, the all-gather into a whole replica 9.41 GiB (bf16)."""
    assert LLAMA2_7B.params == pytest.approx(6.74e9, rel=1e-3)
    layout = CM.Layout(4, tp=4, rollout_tp=2)
    assert CM.switch_bytes(LLAMA2_7B, layout) / 2**30 == pytest.approx(3.14, abs=0.01)
    assert CM.switch_bytes(LLAMA2_7B, replace(layout, switch="allgather")) / 2**30 == pytest.approx(9.41, abs=0.01)
    assert CM.switch_bytes(LLAMA2_7B, CM.Layout(2, tp=2, rollout_tp=2)) == 0.0  # shards reused in place


def test_one_device_step_is_the_sum_of_its_operations():
    job = CM.Job(prompts=2, n=2, prompt_len=4, response_lengths=(3, 3, 3, 3))
    c = CM.step_costs(TINY, FLAT, job, CM.Layout(1))
    tokens = 4 * (4 + 3)
    assert c["update_actor"] == pytest.approx(6 * TINY.matmul_params * tokens / 1e9 + TINY.params * 1e-9)
    assert c["old_log_prob"] == pytest.approx(2 * TINY.matmul_params * tokens / 2e9) == c["ref"]
    prefill = 2 * TINY.matmul_params * 4 * 4 / 2e9
    assert c["gen"] == pytest.approx(prefill + 3 * 0.01)  # 3 decode steps of t0 (no per-request or memory cost)
    assert c["switch"] == 0.0 and c["framework"] == 0.5
    assert c["step"] == pytest.approx(sum(c[k] for k in ("gen", "old_log_prob", "ref", "update_actor", "switch",
                                                           "framework")))


def test_the_longest_response_sets_generation_and_replicas_split_the_rows():
    job = CM.Job(prompts=4, n=1, prompt_len=1, response_lengths=(2, 2, 2, 50))
    one = CM.generation_s(TINY, FLAT, job, replicas=1, tp_r=1)
    assert one == pytest.approx(2 * TINY.matmul_params * 4 / 2e9 + 50 * 0.01)
    two = CM.generation_s(TINY, FLAT, job, replicas=2, tp_r=1)  # rows 0, 2 / 1, 3: the second replica has the 50
    assert two == pytest.approx(2 * TINY.matmul_params * 2 / 2e9 + 50 * 0.01)


def test_communication_adds_on_cpu_and_fsdp_overlaps_on_a_gpu():
    job = CM.Job(prompts=4, n=2, prompt_len=8, response_lengths=(8,) * 8, old_log_prob=False, ref=False)
    dp2 = CM.update_s(TINY, FLAT, job, CM.Layout(2))
    compute = 6 * TINY.matmul_params * job.tokens / (2 * 1e9)
    fsdp = 3 * TINY.weight_bytes * 0.5 / 1e8
    assert dp2 == pytest.approx(compute + fsdp + TINY.params / 2 * 1e-9)
    overlapped = CM.update_s(TINY, replace(FLAT, comm_overlap=True), job, CM.Layout(2))
    assert overlapped == pytest.approx(max(compute, fsdp) + TINY.params / 2 * 1e-9)
    tp2 = CM.update_s(TINY, replace(FLAT, comm_overlap=True), job, CM.Layout(2, tp=2))
    tp_bytes = 4 * TINY.layers * job.tokens * TINY.hidden * 4 * 2 * 0.5
    assert tp2 == pytest.approx(compute + tp_bytes / 1e8 + TINY.params / 2 * 1e-9)  # on the critical path


def test_async_layout_trains_on_its_own_devices():
    """Separate async: the update runs on the devices left after the rollout's (half of them here), so a
    trainer-bound job's update takes twice the colocated one's, and the model's weights travel once per step."""
    dev = replace(CM.H100, step_overhead_s=0.0)
    job = CM.Job(prompts=64, n=4, prompt_len=128, response_lengths=(64,) * 256, ref=False)
    sync = CM.step_costs(CM.QWEN25_7B, dev, job, CM.Layout(8, rollout_tp=2))
    asy = CM.step_costs(CM.QWEN25_7B, dev, job, CM.Layout(8, rollout_tp=2, mode="async", rollout_devices=4))
    assert asy["update_actor"] == pytest.approx(2 * (sync["update_actor"] - CM.QWEN25_7B.params / 8 * dev.optimizer_s_per_param)
                                                + CM.QWEN25_7B.params / 4 * dev.optimizer_s_per_param, rel=0.02)
    assert asy["step"] > sync["update_actor"]  # trainer-bound: overlapping a short generation cannot hide the update
