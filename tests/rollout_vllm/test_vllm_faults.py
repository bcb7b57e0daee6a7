"""vLLM failures are errors, never hangs: a colocated engine whose step raises, and a server replica whose engine
core raises, fail every waiting request within seconds with the original error; whole training runs with
either fault exit non-zero within 30 s naming the cause (local backend and Ray).

The faults are injected by ``vllm_fault_injection.py`` (a patch of the in-process ``LLMEngine``) and
``fault_site/sitecustomize.py`` (the same for the engine core of a server process): no hook in the product.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.base import EngineError

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
from vllm_fault_injection import MESSAGE, install_step_fault  # noqa: E402

FAST_S = 30.0


@pytest.fixture()
def doomed_engine(varied_model_dir, engine_args, tokenizer):
    """An in-process vLLM engine of its own (the fault kills it)."""
    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(varied_model_dir, engine_args=engine_args, tokenizer=tokenizer, seed=0,
                               name="doomed")
    yield engine
    engine.shutdown()


def test_a_colocated_engine_step_fault_reaches_every_request_and_every_later_call(doomed_engine, prompts,
                                                                                  monkeypatch):
    from hybridflow.rollout.service.server import GenerateRequest, RolloutServer
    from vllm.v1.engine.llm_engine import LLMEngine

    # patch a subclass on this engine object only: other engines of the session keep the real class
    faulty = type("FaultyLLMEngine", (LLMEngine,), {})
    install_step_fault(faulty)
    engine = doomed_engine._driver.engine
    monkeypatch.setattr(engine, "__class__", faulty)
    server = RolloutServer(doomed_engine, name="vllm-replica-test", stall_timeout_s=60)
    try:
        start = time.monotonic()
        futures = server.submit_many([GenerateRequest(f"r{i}", p, SamplingParams(max_tokens=8))
                                      for i, p in enumerate(prompts)])
        errors = [f.exception(timeout=FAST_S) for f in futures]
        assert time.monotonic() - start < 10
        for error in errors:
            assert isinstance(error, EngineError), error
            assert MESSAGE in str(error) and "engine traceback" in str(error) and "'doomed'" in str(error)
        with pytest.raises(EngineError, match=MESSAGE):  # a dead driver refuses commands at once
            server.call(doomed_engine.sleep, timeout=10, what="sleep")
        with pytest.raises(EngineError, match=MESSAGE):
            doomed_engine.generate_batch(prompts[:1], SamplingParams(max_tokens=4))
    finally:
        server.close()


@pytest.fixture()
def faulty_fleet(varied_model_dir, engine_args, tmp_path, monkeypatch):
    from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet

    monkeypatch.setenv("PYTHONPATH", f"{HERE / 'fault_site'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("HYBRIDFLOW_INJECT_VLLM_FAULT", "server_step")
    fleet = VLLMServerFleet(varied_model_dir, dict(engine_args), n_servers=1, log_dir=str(tmp_path))
    yield fleet
    fleet.shutdown()


def test_a_server_replica_engine_fault_fails_its_requests_and_is_explained_with_the_server_traceback(
        faulty_fleet, prompts):
    client = faulty_fleet.replicas[0]

    async def all_of_them():
        return await asyncio.gather(*(client.generate(f"r{i}", p, SamplingParams(max_tokens=8))
                                      for i, p in enumerate(prompts)), return_exceptions=True)

    start = time.monotonic()
    results = asyncio.run(all_of_them())
    assert time.monotonic() - start < 10
    assert all(isinstance(r, EngineError) and "replica 'vllm-server-0'" in str(r) for r in results), results
    account = faulty_fleet.explain(results[0])
    assert "died with exit code" in str(account)  # vLLM's server exits once its engine core is dead
    assert "injected vLLM server engine-core fault" in str(account)  # the root cause, from the server's log
    assert "Traceback (most recent call last)" in str(account)


# ---------------------------------------------------------------------------------------------- whole runs
def _run(args, cwd, env_extra, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "hybridflow.trainer.main_ppo", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _stamped(path: Path) -> float:
    assert path.exists(), "the fault never fired"
    return float(path.read_text().split()[0])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_run_whose_colocated_vllm_engine_fails_exits_within_30s_naming_the_cause(
        backend, tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    from vllm_helpers import tiny_command_line, verl_sections

    from hybridflow.config import parse_command_line

    cl = parse_command_line(tiny_command_line(dict(verl_sections())["grpo_trainer/run_deepseek7b_llm.sh"],
                                              tiny_bpe_model_dir, gsm8k_parquet, tmp_path, 1,
                                              [f"trainer.backend={backend}",
                                               "actor_rollout_ref.model.external_lib=vllm_fault_injection"]))
    stamp = tmp_path / "fault_stamp"
    proc = _run(cl.overrides, tmp_path, {"HYBRIDFLOW_INJECT_VLLM_FAULT": "engine_step",
                                         "HYBRIDFLOW_INJECT_FAULT_STAMP": str(stamp)})
    ended = time.time()
    print(f"{backend}: exit {proc.returncode}, {ended - _stamped(stamp):.1f} s after the fault")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert MESSAGE in proc.stderr and "engine traceback" in proc.stderr
    assert ended - _stamped(stamp) < FAST_S


@pytest.mark.slow
def test_a_run_whose_server_replica_fails_exits_within_30s_naming_the_cause(tiny_bpe_model_dir, gsm8k_parquet,
                                                                             tmp_path):
    from vllm_helpers import tiny_command_line, verl_sections

    from hybridflow.config import parse_command_line

    cl = parse_command_line(tiny_command_line(dict(verl_sections())["grpo_trainer/run_deepseek7b_llm.sh"],
                                              tiny_bpe_model_dir, gsm8k_parquet, tmp_path, 1,
                                              ["actor_rollout_ref.hybrid_engine=false"]))
    stamp = tmp_path / "fault_stamp"
    proc = _run(cl.overrides, tmp_path, {
        "HYBRIDFLOW_INJECT_VLLM_FAULT": "server_step", "HYBRIDFLOW_INJECT_FAULT_STAMP": str(stamp),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE), str(HERE / "fault_site")])})
    ended = time.time()
    print(f"server replica: exit {proc.returncode}, {ended - _stamped(stamp):.1f} s after the fault")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "replica 'vllm-server-0'" in proc.stderr
    assert "injected vLLM server engine-core fault" in proc.stderr  # the server's own traceback, from its log
    assert ended - _stamped(stamp) < FAST_S
