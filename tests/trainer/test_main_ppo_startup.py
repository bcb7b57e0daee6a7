"""Start-up of ``train_ppo``: the workers start in a background thread, errors and clean-up behave as a serial start.

One real Ray instance for the module (``test_background_start_survives_its_thread_and_is_released``); the
other tests fail before any Ray process exists.
"""

from __future__ import annotations

import logging
import os
import time

import pytest

ray = pytest.importorskip("ray")

from hybridflow.launch.config import load_config  # noqa: E402
from hybridflow.controller import RayInitError, init_ray  # noqa: E402
from hybridflow.launch.processes import RuntimeStart, init_models  # noqa: E402

A = "actor_rollout_ref"


def _config(model_dir, *extra):
    return load_config([
        f"{A}.model.path={model_dir}", "data.train_files=unused.parquet", "data.val_files=null",
        "data.train_batch_size=2", f"{A}.actor.ppo_mini_batch_size=2", f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
        f"{A}.rollout.name=hf", f"{A}.rollout.n=2", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{A}.ref.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo", "reward_model.num_workers=0",
        "trainer.backend=ray", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=1", "trainer.logger=[console]", *extra,
    ])


def test_background_start_error_is_raised_unchanged_by_result(tiny_model_dir):
    """A bad ``ray_kwargs.ray_init`` fails in the thread; ``result()`` raises the same RayInitError."""
    start = RuntimeStart(_config(tiny_model_dir, "+ray_kwargs.ray_init.num_cpuz=2"))
    with pytest.raises(RayInitError, match=r"(?s)a new local Ray instance with arguments .*num_cpuz"):
        start.result()
    start.abandon()  # nothing to release; must not raise either
    assert not ray.is_initialized()


def test_unreachable_ray_address_env_is_named(monkeypatch):
    """``RAY_ADDRESS`` is how a user asks to attach; a dead one fails in seconds naming the variable."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(RayInitError, match=r"the RAY_ADDRESS environment variable='127.0.0.1:9'"):
        init_ray({"num_cpus": None})  # a reachability probe, not Ray's own minutes-long retry loop
    assert not ray.is_initialized()


def test_no_address_starts_a_new_instance_instead_of_joining_a_running_one(monkeypatch):
    """Without an address ``ray.init`` would join the last ``ray start`` cluster of the machine; init_ray
    asks for ``local`` explicitly (the stand-in ``ray.init`` records the call and starts nothing)."""
    seen = []

    def record(**kwargs):
        seen.append(kwargs)
        raise RuntimeError("recorded")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "init", record)
    with pytest.raises(RayInitError):
        init_ray({"num_cpus": 2})
    assert seen == [{"num_cpus": 2, "address": "local", "include_dashboard": False, "logging_level": logging.WARNING}]
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(RayInitError, match="RAY_ADDRESS='auto'"):
        init_ray({"num_cpus": None})
    assert seen[1] == {"num_cpus": None}  # attaching: no lean defaults forced on the user's cluster


def _ray_pids() -> list[int]:
    import psutil

    me = psutil.Process()
    return [p.pid for p in me.children(recursive=True) if "gcs_server" in " ".join(p.cmdline())]


def test_background_start_survives_its_thread_and_is_released(tiny_model_dir):
    """Ray starts on the calling thread (its GCS/raylet die with the *thread* that forked them, PR_SET_PDEATHSIG,
    and a fork from a secondary thread of a long-lived process crashed before exec), the worker processes in the
    background thread, which stays parked while the run uses Ray; ``abandon()`` (the driver failed first)
    releases it all."""
    pytest.importorskip("psutil")
    start = RuntimeStart(_config(tiny_model_dir, "ray_kwargs.ray_init.num_cpus=1"))
    assert ray.is_initialized()  # before result(): ray.init ran on this (the main) thread
    runtime = start.result()
    gcs = _ray_pids()
    assert gcs, "no gcs_server child process: Ray was not started by this run"
    time.sleep(2.0)  # a GCS killed by its parent thread's exit would be gone by now
    assert start._thread is not None and start._thread.is_alive()
    assert ray.cluster_resources().get("CPU") == 1.0
    init_models(runtime, total_training_steps=1)  # the worker still answers after the thread parked
    start.abandon()
    assert not ray.is_initialized()
    start._thread.join(timeout=10)
    assert not start._thread.is_alive()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in gcs):
        time.sleep(0.2)
    assert not [pid for pid in gcs if os.path.exists(f"/proc/{pid}") and
                open(f"/proc/{pid}/stat").read().split()[2] != "Z"], "gcs_server outlived the run"


def test_token_auth_failure_says_how_to_attach(monkeypatch):
    """Ray 2.60's `ray start` enables token auth; a driver without RAY_AUTH_MODE=token is told so."""

    def refuse(**kwargs):
        raise ConnectionError("Failed to connect: InvalidAuthToken: Authentication token is missing or incorrect")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(RayInitError, match=r"export RAY_AUTH_MODE=token"):
        init_ray({"address": "auto"})
    monkeypatch.setattr(ray, "init", lambda **kw: (_ for _ in ()).throw(ValueError("num_cpus must be positive")))
    with pytest.raises(RayInitError) as err:
        init_ray({"address": "auto"})
    assert "RAY_AUTH_MODE" not in str(err.value)
