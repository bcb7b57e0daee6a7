"""Fixtures for engine tests: a loaded tiny causal LM and the rollout-shaped batch builders."""

import importlib.util
from pathlib import Path

import pytest


def load_batches_module():
    """``tests/engine/batches.py`` (test helpers shared with tests/workers; importlib import mode)."""
    spec = importlib.util.spec_from_file_location("hf_test_batches", Path(__file__).with_name("batches.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def batches():
    return load_batches_module()


@pytest.fixture(scope="module")
def tiny_causal_lm(tiny_model_dir):
    from hybridflow.engine.model_loader import load_causal_lm

    return load_causal_lm(tiny_model_dir).eval()
