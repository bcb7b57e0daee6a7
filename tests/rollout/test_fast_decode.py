"""The lean decode step gives the same tokens and log-probs as transformers' forward, and is only used on
the model structures it supports."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.fast_decode import fast_decoder_for
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model


def _compare(model, tok, prompts, params):
    slow = HFRolloutEngine(model, tok, seed=3, fast_decode=False).generate_batch(prompts, params)
    fast_engine = HFRolloutEngine(model, tok, seed=3)
    assert fast_engine._batcher.fast is not None, fast_engine._batcher.fast_reason
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)
    try:
        fast = fast_engine.generate_batch(prompts, params)
    finally:
        hook.remove()
    assert len(calls) == fast_engine.stats()["prefill_forwards"] >= 1  # only the prefill went through model.forward
    assert [o.token_ids for o in fast] == [o.token_ids for o in slow]
    for a, b in zip(fast, slow):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral-window"])
def test_fast_decode_equals_forward(arch, model_and_tokenizer, prompt_texts):
    if arch == "qwen2":
        model, tok = model_and_tokenizer
    elif arch == "mistral-window":  # every layer attends over the last 4 tokens only: the windowed decode mask
        tok = build_char_tokenizer()
        model = build_tiny_model(tok, size="nano", arch="mistral", sliding_window=4, initializer_range=0.5).eval()
    else:  # GQA (4 heads, 2 kv heads); qwen3 adds per-head q/k norms
        tok = build_char_tokenizer()
        model = build_tiny_model(tok, size="nano", arch=arch, initializer_range=0.5).eval()
    prompts = [tok.encode(t) for t in prompt_texts]
    _compare(model, tok, prompts, SamplingParams(do_sample=False, max_tokens=10, logprobs=True))
    _compare(model, tok, prompts, SamplingParams(temperature=0.9, top_p=0.9, max_tokens=10, logprobs=True))


def test_unsupported_structures_fall_back_with_a_reason(model_and_tokenizer):
    from peft import LoraConfig, get_peft_model

    tok = build_char_tokenizer()
    gpt2 = build_tiny_model(tok, size="nano", arch="gpt2")
    decoder, reason = fast_decoder_for(gpt2)
    assert decoder is None and "model_type 'gpt2'" in reason
    lora = get_peft_model(build_tiny_model(tok, size="nano"), LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    assert fast_decoder_for(lora.base_model.model)[1] == "projections that are not plain nn.Linear (e.g. LoRA adapters)"
    gemma2 = build_tiny_model(tok, size="nano", family="gemma2")
    assert "soft-capped" in fast_decoder_for(gemma2)[1]
    engine = HFRolloutEngine(gpt2.eval(), tok)  # the engine still works, through model.forward
    out = engine.generate_batch([tok.encode("1+1=")], SamplingParams(do_sample=False, max_tokens=3))
    assert len(out[0].token_ids) == 3


def test_packed_linears_follow_every_kind_of_weight_change():
    """The decode step's oneDNN-prepacked weights equal F.linear, and are repacked after in-place updates (version
    counter), replaced storage, and value changes that bypass the version counter (fused optimizers: caught by
    the batcher's weights stamp)."""
    from hybridflow.rollout.hf.fast_decode import PackedLinears

    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96)
    packed = PackedLinears([layer], min_elements=0)
    assert packed.enabled, "the pinned CPU torch has oneDNN: the decode step's packed path must be on"
    x = torch.randn(5, 1, 64)

    def check():
        assert torch.allclose(packed.linear(layer, x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)

    packed.refresh("w0")
    check()
    with torch.no_grad():
        layer.weight.mul_(0.5)  # an optimizer step: bumps the version counter
    packed.refresh("w0")
    check()
    layer.weight = torch.nn.Parameter(torch.randn(96, 64))  # new storage
    packed.refresh("w0")
    check()
    with torch.no_grad():
        layer.weight.data.add_(1.0)  # through .data: the version counter does not see it
    packed.refresh("w0")
    assert not torch.allclose(packed.linear(layer, x), F.linear(x, layer.weight, layer.bias))  # stale, as expected
    packed.refresh("w1")  # the batcher's fingerprint of the values moved: everything is repacked
    check()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 compute keeps the plain (autocast) matmul
        assert packed.linear(layer, x).dtype == torch.bfloat16


def test_small_weights_stay_on_f_linear():
    """Below PACK_MIN_ELEMENTS the packed call costs more than F.linear (measured, see fast_decode.py): such weights
    are left unpacked (bit-equal to F.linear), and a set with nothing to pack is off (no weights fingerprint)."""
    from hybridflow.rollout.hf.fast_decode import PACK_MIN_ELEMENTS, PackedLinears

    torch.manual_seed(0)
    small, big = torch.nn.Linear(192, 640), torch.nn.Linear(512, PACK_MIN_ELEMENTS // 512)
    assert not PackedLinears([small]).enabled
    packed = PackedLinears([small, big])
    assert packed.enabled
    packed.refresh("w0")
    assert set(packed._packed) == {id(big)}
    x = torch.randn(7, 1, 192)
    assert torch.equal(packed.linear(small, x), F.linear(x, small.weight, small.bias))
