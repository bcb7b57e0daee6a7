"""Shared fixtures: tiny HF checkpoints built locally (no downloads) and single-thread torch."""

from __future__ import annotations

import os

# 2 cores on CI: more OpenMP threads than free cores slows everything ~10x.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Tests start their own Ray instances (address="local"); a RAY_ADDRESS left in the shell would point hybridflow's
# runs at an outside cluster instead (an explicit RAY_ADDRESS is honoured by init_ray).
os.environ.pop("RAY_ADDRESS", None)
# For the tests that call ray.init themselves (init_ray allows LOCAL_START_WAIT_S and tries a failed start once
# more): on a busy 2-core runner Ray's GCS server can need more than Ray's default 30 s to publish its port.
os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A ~0.4M-parameter Qwen2 with a char-level ChatML tokenizer, saved as an HF folder."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_model"), size="tiny"))


@pytest.fixture(scope="session")
def nano_model_dir(tmp_path_factory):
    """A ~0.1M-parameter Qwen2 (fastest) with the char tokenizer."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("nano_model"), size="nano"))


@pytest.fixture(scope="session")
def bpe_model_dir(tmp_path_factory):
    """A tiny Qwen2 with a byte-level BPE tokenizer (for text-heavy data such as GSM8K)."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("bpe_model"), size="nano", tokenizer="bpe"))


GSM8K_SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fixtures", "gsm8k_sample")


@pytest.fixture(scope="session")
def gsm8k_dir():
    """Real GSM8K rows kept in the repository (64 train, 32 test; tests/data/fixtures/gsm8k_sample/README.md)."""
    return GSM8K_SAMPLE


@pytest.fixture(scope="session")
def gsm8k_full_dir():
    """The whole GSM8K jsonl, where a machine has it ($HYBRIDFLOW_SHARED/data/gsm8k or ../shared/data/gsm8k beside
    the repository); the tests that need every row are skipped, saying where they looked, on a plain clone."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(os.environ["HYBRIDFLOW_SHARED"], "data", "gsm8k")] if "HYBRIDFLOW_SHARED" in os.environ else []
    candidates.append(os.path.abspath(os.path.join(here, "..", "..", "shared", "data", "gsm8k")))
    for path in candidates:
        if os.path.isfile(os.path.join(path, "train.jsonl")) and os.path.isfile(os.path.join(path, "test.jsonl")):
            return path
    pytest.skip(f"the full GSM8K data is not on this machine (looked in {candidates}; set HYBRIDFLOW_SHARED); "
                "the repository's sample (tests/data/fixtures/gsm8k_sample) covers the same code")


@pytest.fixture(autouse=True, scope="module")
def _no_leaked_process_group():
    """A test module that joins a torch.distributed group in this process must not leak it to the next."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory):
    """A ~0.14M-parameter Qwen2-VL (nano language model + 2-block vision tower) with its processor."""
    from hybridflow.utils.tiny_vlm import make_tiny_vlm_checkpoint

    return str(make_tiny_vlm_checkpoint(tmp_path_factory.mktemp("tiny_vlm"), size="nano", arch="qwen2_vl"))


@pytest.fixture(scope="session")
def tiny_vlm25_dir(tmp_path_factory):
    """The Qwen2.5-VL variant (windowed vision attention, tokens_per_second)."""
    from hybridflow.utils.tiny_vlm import make_tiny_vlm_checkpoint

    return str(make_tiny_vlm_checkpoint(tmp_path_factory.mktemp("tiny_vlm25"), size="nano", arch="qwen2_5_vl"))


@pytest.fixture(scope="session")
def varied_vlm_dir(tmp_path_factory):
    """The tiny Qwen2-VL with initializer_range=0.2 (language model and vision tower): peaked next-token
    distributions that depend on the image, so greedy-equality and log-prob tests can fail."""
    from hybridflow.utils.tiny_vlm import make_tiny_vlm_checkpoint

    return str(make_tiny_vlm_checkpoint(tmp_path_factory.mktemp("varied_vlm"), size="nano", arch="qwen2_vl",
                                        initializer_range=0.2))


# Tests that assert on wall-clock bounds (a fault reported within seconds, a signal answered in time, a sandbox
# timeout of a few seconds), kill a process at a chosen moment, count the machine's processes or threads, or
# start a Ray cluster of their own (`ray start`, the GCS start-up tests): `make test` runs them after the parallel
# part, alone on the machine (`-m serial`), so a neighbour's load cannot make them fail. The other fault tests
# (bad input, silent runs, an engine fault exiting with its cause, SIGTERM to a run, a full disk, reward hacks
# scored in the sandbox with a 3 s limit for programs that take milliseconds) assert what a run or a program
# says and how it exits, and run in the parallel part, as do the benchmark scripts'
# smoke tests (tests/benchmarks: no timings) and the two-node `ray start` cluster of
# controller/test_ray_cli_cluster.py (its own ports, temp dir and token; no timings). xdist runs each test on
# its worker's main thread, so signal handlers can be installed there.
SERIAL = ("faults/test_waits.py", "faults/test_sandbox.py", "faults/test_sandbox_server.py",
          "faults/test_stuck_user_code.py", "faults/test_checkpoint_kill.py",
          "faults/test_worker_kill.py", "controller/test_init_ray.py", "controller/test_ray_failures.py",
          "controller/test_multinode.py", "integration/test_ray_footprint.py",
          "rollout/test_engine_faults.py", "rollout/test_stall_watchdog.py", "rollout/test_checkpoint_engine_faults.py",
          "tools/test_mcp_tool.py", "tools/test_executor.py", "rollout_vllm/",
          "integration/test_async_reward_run.py")


def pytest_collection_modifyitems(config, items):
    """``serial`` on the tests of SERIAL, ``full`` on those of the full tier (tests/tiers.py); ``@pytest.mark.gpu``
    tests need CUDA: on a machine without it they are skipped, saying so."""
    from tiers import in_full_tier

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    for item in items:
        rel = str(item.path).removeprefix(here)
        if rel.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
        if in_full_tier(f"{rel}::{item.name}"):
            item.add_marker(pytest.mark.full)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False here); run on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_cluster(request):
    """The one local Ray instance of a test module (``RAY_CPUS`` in the module sets its logical CPUs, default 2),
    shut down after the module's last test that asked for it."""
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=getattr(request.module, "RAY_CPUS", 2), include_dashboard=False,
             log_to_driver=False)
    yield ray
    ray.shutdown()
