"""Packed rows with attention padded inside (engine/padded_attention.py): the trimmed layout's log-probs and
gradients, no dense mask, sdpa on the padded batch, and only for the models it is right for."""

import pytest
import torch

from hybridflow.engine.forward import response_log_probs
from hybridflow.engine.padded_attention import PackLayout, padded_attention, supports_padded_attention


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _log_probs_and_grads(model, data, packed):
    model.zero_grad(set_to_none=True)
    lp, _ = response_log_probs(model, data.batch, 0.9, packed=packed)
    mask = data.batch["response_mask"].bool()
    (lp * data.batch["response_mask"]).sum().backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return lp[mask].detach(), grads


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "activation_checkpointing"])
def test_packed_rows_with_padded_attention_equal_the_trimmed_layout(tiny_model_dir, batches, checkpointing):
    from hybridflow.engine.model_loader import load_causal_lm

    model = load_causal_lm(tiny_model_dir).train()
    assert supports_padded_attention(model)
    if checkpointing:  # the recomputation in the backward pass runs outside padded_attention's block
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    data = batches.make_rollout_batch(model.config.vocab_size, batch_size=6, prompt_len=7, response_len=5, seed=3)
    trimmed, g_trimmed = _log_probs_and_grads(model, data, packed=False)
    packed, g_packed = _log_probs_and_grads(model, data, packed=True)
    assert torch.allclose(packed, trimmed, atol=1e-5), (packed - trimmed).abs().max()
    assert g_packed.keys() == g_trimmed.keys() and g_packed
    for name, g in g_packed.items():
        assert torch.allclose(g, g_trimmed[name], atol=1e-5), name


def _spy_on_sdpa(monkeypatch) -> list[tuple]:
    """(query shape, mask given, is_causal) of every torch sdpa call."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, *a, is_causal=False, **kw):
        calls.append((tuple(q.shape), attn_mask is not None, is_causal))
        return real(q, k, v, attn_mask, *a, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    return calls


def test_the_packed_pass_runs_causal_sdpa_on_the_padded_batch_without_a_mask(tiny_causal_lm, batches, monkeypatch):
    data = batches.make_rollout_batch(tiny_causal_lm.config.vocab_size, batch_size=5, prompt_len=6, response_len=4,
                                      seed=1)
    calls = _spy_on_sdpa(monkeypatch)
    with torch.no_grad():
        response_log_probs(tiny_causal_lm, data.batch, 1.0, packed=True)
    width = int(data.batch["attention_mask"].sum(dim=1).max())
    layers = tiny_causal_lm.config.num_hidden_layers
    assert [(c[0][0], c[0][2], c[1], c[2]) for c in calls] == [(5, width, False, True)] * layers
    calls.clear()
    with torch.no_grad():  # the trimmed layout: transformers' own sdpa with the padding mask
        response_log_probs(tiny_causal_lm, data.batch, 1.0, packed=False)
    assert len(calls) == layers and all(c[1] and not c[2] for c in calls)


def test_a_sequence_that_sees_its_padding_is_caught(tiny_causal_lm, batches, monkeypatch):
    """The equality test can fail: attention over the whole padded width (not causal) changes the log-probs."""
    data = batches.make_rollout_batch(tiny_causal_lm.config.vocab_size, batch_size=5, prompt_len=6, response_len=4,
                                      seed=2)
    with torch.no_grad():
        trimmed, _ = response_log_probs(tiny_causal_lm, data.batch, 1.0, packed=False)
        real = torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda q, k, v, attn_mask=None, *a, is_causal=False, **kw: real(q, k, v, attn_mask, *a, **kw))
        broken, _ = response_log_probs(tiny_causal_lm, data.batch, 1.0, packed=True)
    rows = data.batch["response_mask"].bool()
    assert (broken[rows] - trimmed[rows]).abs().max() > 1e-3


def test_layout_of_a_left_padded_batch():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]], dtype=torch.bool)
    layout = PackLayout.of(mask)
    assert layout.rows.tolist() == [0, 0, 1, 1, 1, 2] and layout.cols.tolist() == [0, 1, 0, 1, 2, 0]
    assert (layout.batch, layout.width) == (3, 3)
    x = torch.arange(6.0).view(1, 1, 6, 1)  # (1, H, N, D)
    padded = layout.pad(x)
    assert padded[:, 0, :, 0].tolist() == [[0, 1, 0], [2, 3, 4], [5, 0, 0]]
    assert layout.unpad(padded.transpose(1, 2)).flatten().tolist() == list(range(6))


def test_only_models_whose_attention_needs_no_mask_but_causality(tiny_causal_lm):
    config = tiny_causal_lm.config
    impl, types = config._attn_implementation, getattr(config, "layer_types", None)
    try:
        config._attn_implementation = "sdpa"
        assert supports_padded_attention(tiny_causal_lm)
        config._attn_implementation = "eager"
        assert not supports_padded_attention(tiny_causal_lm)
        config._attn_implementation = "sdpa"
        config.layer_types = ["sliding_attention"] + ["full_attention"] * (config.num_hidden_layers - 1)
        assert not supports_padded_attention(tiny_causal_lm)
    finally:
        config._attn_implementation = impl
        config.layer_types = types


def test_padded_attention_refuses_a_pack_of_another_size(tiny_causal_lm):
    ids = torch.tensor([[5, 6, 7, 8]])
    with padded_attention(torch.ones(1, 3, dtype=torch.bool)) as pack, pytest.raises(RuntimeError, match="pack of 3"):
        tiny_causal_lm(input_ids=ids, position_ids=torch.arange(4)[None], use_cache=False, **pack)


def test_a_sliding_window_shorter_than_the_sequences_gets_a_banded_mask(batches):
    """Mistral's model-wide window (3 here, rows up to 13 tokens): the packed rows keep it (a banded mask on the
    padded batch) and equal the trimmed layout, whose mask transformers builds; without the band they differ."""
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    model = build_tiny_model(build_char_tokenizer(), size="nano", seed=0, arch="mistral").eval()
    model.config._attn_implementation = "sdpa"
    model.config.sliding_window = 3
    assert supports_padded_attention(model)
    data = batches.make_rollout_batch(model.config.vocab_size, batch_size=5, prompt_len=7, response_len=6, seed=4)
    rows = data.batch["response_mask"].bool()
    with torch.no_grad():
        trimmed, _ = response_log_probs(model, data.batch, 1.0, packed=False)
        packed, _ = response_log_probs(model, data.batch, 1.0, packed=True)
        model.config.sliding_window = None  # the same weights attending over the whole sequence
        unbanded, _ = response_log_probs(model, data.batch, 1.0, packed=True)
    assert torch.allclose(packed[rows], trimmed[rows], atol=1e-5), (packed[rows] - trimmed[rows]).abs().max()
    assert (unbanded[rows] - trimmed[rows]).abs().max() > 1e-3
