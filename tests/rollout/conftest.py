"""Rollout fixtures: a nano Qwen2 whose random init is wide enough to give varied (tie-free) outputs."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory):
    """nano Qwen2 + char tokenizer with initializer_range=0.5: a std-0.02 init gives near-uniform logits
    whose greedy outputs repeat one token, which would make equality tests weak."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("varied_nano"), size="nano", initializer_range=0.5))


@pytest.fixture(scope="module")
def model_and_tokenizer(varied_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(varied_model_dir)
    model = AutoModelForCausalLM.from_pretrained(varied_model_dir, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="module")
def prompt_texts():
    return ["1+2=", "what is 17*3?", "hello there, how are you", "x", "The answer is", "99-98="]
