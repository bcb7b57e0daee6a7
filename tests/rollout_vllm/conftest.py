"""The vLLM tests: every test here is marked ``vllm`` and skipped, with the reason, where vLLM is not installed.

``make test-vllm`` runs them for real in .venv-vllm (vllm-cpu 0.32).  Engines are expensive (seconds to start,
1.5-3 GB each, both cores): fixtures share one engine per module and always shut it down.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HERE = Path(__file__).parent

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; overridden per engine by kv_cache_memory_bytes
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="vllm is not installed here; `make test-vllm` runs these tests in .venv-vllm")
    for item in items:
        if Path(str(item.fspath)).parent == HERE:
            item.add_marker(pytest.mark.vllm)
            if not HAVE_VLLM:
                item.add_marker(skip)


# Small KV cache and no torch.compile: start-up in seconds, about 1.5 GB for the whole engine.
TEST_ENGINE_ARGS = {"dtype": "float32", "enforce_eager": True, "max_model_len": 256, "max_num_seqs": 64,
                    "max_num_batched_tokens": 2048, "kv_cache_memory_bytes": 64 << 20, "load_format": "auto"}


@pytest.fixture(scope="session")
def engine_args():
    return dict(TEST_ENGINE_ARGS)


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory):
    """tiny Qwen2 + char tokenizer, initializer_range=0.5 so greedy outputs vary (see tests/rollout); tiny, not
    nano: vLLM's CPU attention needs head_dim >= 32."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("vllm_tiny"), size="tiny", initializer_range=0.5))


@pytest.fixture(scope="module")
def hf_model(varied_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(varied_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(varied_model_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    texts = ["1+2=", "what is 17*3?", "hello there, how are you", "x", "The answer is", "99-98="]
    return [tokenizer.encode(t) for t in texts]


@pytest.fixture(scope="session")
def hf_reference():
    """The two HF reference helpers of tests/vllm_helpers.py (hf_greedy, hf_log_probs)."""
    from vllm_helpers import hf_greedy, hf_log_probs

    return hf_greedy, hf_log_probs



@pytest.fixture(scope="session")
def tiny_bpe_model_dir(tmp_path_factory):
    """tiny Qwen2 (head_dim 32, as vLLM's CPU attention needs) with the byte-level BPE tokenizer (GSM8K text)."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("vllm_bpe"), size="tiny", tokenizer="bpe"))


@pytest.fixture(scope="session")
def gsm8k_parquet(tmp_path_factory, gsm8k_dir):
    """verl's GSM8K parquet layout written by hybridflow's preprocessor from the local jsonl."""
    from hybridflow.data.preprocess.gsm8k import main

    out = tmp_path_factory.mktemp("gsm8k")
    main(["--input", gsm8k_dir, "--local-dir", str(out)])
    return out
