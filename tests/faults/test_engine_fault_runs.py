"""Whole training runs whose ``hf`` engine fails exit non-zero within 30 s of the fault, naming the cause.

The real CLI (``python -m hybridflow.trainer.main_ppo``) runs the tiny GRPO run of ``base_args`` as a
subprocess, on the local backend and on Ray; ``engine_fault_injection.py`` (imported in the engine's process
through verl's ``actor_rollout_ref.model.external_lib``) breaks one step of the batcher and stamps the time it
did.  Before these fixes, a fault during admission or prefill (NaN logits, an out-of-memory error, a cache
protocol that changed with transformers) left every trajectory waiting forever at 0% CPU.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from .conftest import base_args, cli_command, cli_env

HERE = Path(__file__).resolve().parent
EXIT_ROLLOUT_FAILED = 3
LIMIT_S = 30.0
CAUSES = {  # what the message must say, besides the engine traceback
    "admission": "injected admission fault",
    "prefill": "CUDA out of memory",
    "decode": "injected decode fault",
    "nan_prefill": "non-finite logits",
    "nan_decode": "non-finite logits",
    "cache_signature": "cannot take the call transformers",
    "stall_decode": "made no progress",
}


def _run_with_fault(fault, backend, tmp_path, nano_model_dir, fault_data):
    stamp = tmp_path / "fault_stamp"
    extra = ["actor_rollout_ref.model.external_lib=engine_fault_injection"]
    if fault == "stall_decode":
        extra.append("actor_rollout_ref.rollout.stall_timeout_s=2")
    if fault.startswith("nan_"):  # injected into the sampler's logits: exact log-probs (CPU's default) take another path
        extra.append("actor_rollout_ref.rollout.exact_log_probs=false")
    if backend == "ray":
        extra.append("ray_kwargs.ray_init.num_cpus=2")
    env = cli_env()
    env.update(HYBRIDFLOW_INJECT_FAULT=fault, HYBRIDFLOW_INJECT_FAULT_STAMP=str(stamp),
               PYTHONPATH=f"{env['PYTHONPATH']}:{HERE}")
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=2, backend=backend, extra=extra)
    proc = subprocess.run(cli_command(args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert stamp.exists(), f"the fault never fired:\n{proc.stderr[-3000:]}"
    after = ended - float(stamp.read_text().split()[0])
    print(f"{backend} {fault}: exit {proc.returncode} {after:.1f} s after the fault")
    return proc, after


def _check(proc, after, fault):
    assert proc.returncode == EXIT_ROLLOUT_FAILED, proc.stderr[-3000:]
    message = proc.stderr
    assert CAUSES[fault] in message, message[-3000:]
    assert "rollout engine 'actor_rollout/rank0'" in message or "replica 'actor_rollout/rank0'" in message
    if fault != "stall_decode":
        assert "--- engine traceback ---" in message and "Traceback (most recent call last)" in message
    else:
        assert "thread 'hf-rollout" in message  # where the engine was stuck
    assert "the run stopped" in message
    assert after < LIMIT_S


@pytest.mark.slow
@pytest.mark.parametrize("fault", list(CAUSES))
def test_local_run_with_an_engine_fault_exits_naming_the_cause(fault, tmp_path, nano_model_dir, fault_data):
    proc, after = _run_with_fault(fault, "local", tmp_path, nano_model_dir, fault_data)
    _check(proc, after, fault)


@pytest.mark.slow
# an exception raised in the engine (admission; nan_decode takes the same path once it is an EngineError, and is run
# locally above) and a stuck engine caught by the watchdog: the two ways a fault leaves a Ray worker
@pytest.mark.parametrize("fault", ["admission", "stall_decode"])
def test_ray_run_with_an_engine_fault_exits_naming_the_cause(fault, tmp_path, nano_model_dir, fault_data):
    proc, after = _run_with_fault(fault, "ray", tmp_path, nano_model_dir, fault_data)
    _check(proc, after, fault)
