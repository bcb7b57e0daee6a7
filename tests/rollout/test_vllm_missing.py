"""Without vLLM, asking for it names the extra and the command (runs in every venv)."""

from __future__ import annotations

import importlib.util

import pytest

from hybridflow.rollout import create_rollout_engine


@pytest.fixture
def no_vllm(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))


def test_missing_vllm_names_the_extra_and_the_command(no_vllm):
    with pytest.raises(ImportError) as e:
        create_rollout_engine("vllm", model_path="/nowhere")
    msg = str(e.value)
    assert "pip install hybridflow[vllm]" in msg and "make venv-vllm" in msg and "rollout.name=hf" in msg


def test_the_engine_module_checks_too(no_vllm):
    from hybridflow.rollout.vllm.engine import require_vllm

    with pytest.raises(ImportError, match=r"pip install hybridflow\[vllm\].*make venv-vllm"):
        require_vllm()
