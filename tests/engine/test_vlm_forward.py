"""Log-probs of a tiny Qwen2-VL through engine/forward.py equal the HF model computing its own positions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("vlm_batches", Path(__file__).with_name("vlm_batches.py"))
vlm_batches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vlm_batches)


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    from hybridflow.engine.model_loader import load_causal_lm, load_processor

    model = load_causal_lm(tiny_vlm_dir)
    model.eval()
    return model, load_processor(tiny_vlm_dir)


@pytest.mark.parametrize("packed", [False, True])
def test_response_log_probs_equal_hf_own_positions(vlm, packed):
    from hybridflow.engine.forward import response_log_probs

    model, processor = vlm
    data = vlm_batches.make_vlm_rollout_batch(processor, model.config, rows=4, seed=1, text_only_rows=(2,))
    with torch.no_grad():
        want = vlm_batches.hf_reference_log_probs(model, processor, data)
        got, _ = response_log_probs(model, data.batch, packed=packed,
                                    multi_modal_inputs=data.non_tensor_batch["multi_modal_inputs"])
    mask = data.batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)
    # the pixels matter: without them the image tokens are plain embeddings and the log-probs move
    with torch.no_grad():
        blind, _ = response_log_probs(model, data.batch, packed=packed)
    assert not torch.allclose(blind[mask], want[mask], atol=1e-4)


def test_text_positions_would_be_wrong(vlm):
    """Feeding 1-D text positions to a VLM changes the result: the M-RoPE rows are what makes it equal."""
    from hybridflow.engine.forward import response_log_probs

    model, processor = vlm
    data = vlm_batches.make_vlm_rollout_batch(processor, model.config, rows=2, seed=2)
    batch = dict(data.batch)
    batch["position_ids"] = data.batch["position_ids"][:, 0]
    with torch.no_grad():
        want = vlm_batches.hf_reference_log_probs(model, processor, data)
        got, _ = response_log_probs(model, batch, multi_modal_inputs=data.non_tensor_batch["multi_modal_inputs"])
    mask = data.batch["response_mask"].bool()
    assert not torch.allclose(got[mask], want[mask], atol=1e-5)
