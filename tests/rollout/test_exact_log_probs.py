"""Exact on-policy log-probs (rollout.exact_log_probs): with batch-invariant kernels (engine/batch_invariant.py) the hf
engine's per-token log-probs -- batched prefill, cached decode, continuous batching -- equal the trainer's bit for bit
on CPU fp32, in every layout the trainer uses, fused head or not; without them they do not."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from multirank import run_ranks  # noqa: E402


def _scenario(tmp_path, model_dir, exact: bool, fast: bool, strict: bool) -> dict:
    env = {"OMP_NUM_THREADS": "2", "HYBRIDFLOW_STRICT_MATMUL": "1" if strict else "0",
           "MKL_CBWR": "AUTO,STRICT" if strict else "AUTO"}
    (log,) = run_ranks(HERE / "exact_scenario.py", 1, [model_dir, int(exact), int(fast)], tmp_path / "logs",
                       timeout=600, env=env)
    return json.loads(log.strip().splitlines()[-1])


@pytest.mark.parametrize("fast", [True, False], ids=["fast-decode", "model-forward"])
def test_rollout_log_probs_equal_the_trainers_bit_for_bit(varied_model_dir, tmp_path, fast):
    result = _scenario(tmp_path, varied_model_dir, exact=True, fast=fast, strict=True)
    assert result["strict"] and len(result["lengths"]) > 1  # responses of several lengths
    diffs = {k: v for k, v in result.items() if k.startswith("fused")}
    assert diffs and all(v == 0.0 for v in diffs.values()), diffs


def test_without_batch_invariant_kernels_they_differ_in_the_last_bits(varied_model_dir, tmp_path):
    """Why exact mode exists: the cached decode's products and attention are another arithmetic."""
    result = _scenario(tmp_path, varied_model_dir, exact=False, fast=True, strict=False)
    assert 0.0 < max(v for k, v in result.items() if k.startswith("fused")) < 1e-4


def test_exact_sampling_is_reproducible_and_samples(model_and_tokenizer, prompt_texts):
    model, tok = model_and_tokenizer
    prompts = [tok.encode(t) for t in prompt_texts]

    def generate():
        engine = HFRolloutEngine(model, tok, seed=5, exact_log_probs=True)
        params = SamplingParams(temperature=0.7, max_tokens=10, logprobs=True)
        return [o.token_ids for o in engine.generate_batch([p for p in prompts for _ in range(3)], params)]

    a, b = generate(), generate()
    assert a == b
    assert len({tuple(t) for t in a}) > len(prompts)  # samples of one prompt differ: it samples, not argmax


def test_a_model_that_cannot_be_exact_is_refused_naming_the_key(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="exact_log_probs=false"):
        HFRolloutEngine(model, tok, exact_log_probs=True)
