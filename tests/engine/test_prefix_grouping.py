"""Shared-prefix grouping (actor.use_prefix_grouper): the prompt runs once per group, and the log-probs, entropies
and gradients equal the ungrouped forward's."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engine.forward import response_token_outputs
from hybridflow.engine.prefix_grouping import group_rows


def grouped_batch(vocab: int, prompt_lens=(5, 3, 4), samples=(3, 2, 1), prompt_cols: int = 6, resp_cols: int = 5,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows as the rollout returns them, ``samples[i]`` rows for prompt i, rows of different prompts interleaved
    (grouping goes by the prompt's tokens, not by row order), ragged right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(5, vocab, (p,), generator=g) for p in prompt_lens]
    order = [i for k in range(max(samples)) for i, n in enumerate(samples) if k < n]
    rows = []
    for i in order:
        r = int(torch.randint(1, resp_cols + 1, (1,), generator=g))
        prompt = torch.zeros(prompt_cols, dtype=torch.long)
        prompt[prompt_cols - len(prompts[i]):] = prompts[i]
        pmask = (torch.arange(prompt_cols) >= prompt_cols - len(prompts[i])).long()
        resp = torch.zeros(resp_cols, dtype=torch.long)
        resp[:r] = torch.randint(5, vocab, (r,), generator=g)
        rmask = (torch.arange(resp_cols) < r).long()
        rows.append((prompt, pmask, resp, rmask))
    prompts_t, pmask, resp, rmask = (torch.stack(x) for x in zip(*rows))
    attention = torch.cat([pmask, rmask], 1)
    return {"prompts": prompts_t, "responses": resp, "response_mask": rmask, "input_ids": torch.cat([prompts_t, resp], 1),
            "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0)}


def test_the_prompt_runs_once_per_group(tiny_causal_lm):
    b = grouped_batch(tiny_causal_lm.config.vocab_size)
    groups = group_rows(b["input_ids"], b["attention_mask"], b["position_ids"], b["responses"].shape[1])
    assert groups.n_groups == 3
    responses = int(b["response_mask"].sum())
    # each prompt once (less its last token, repeated per sample), each response with that token in front
    assert groups.ids.shape[1] == (5 - 1) + (3 - 1) + (4 - 1) + responses + 6
    assert groups.ids.shape[1] < int(b["attention_mask"].sum())  # the 6 rows' tokens, ungrouped
    assert groups.keep.numel() == responses


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_and_entropy_equal_the_ungrouped_forward(tiny_causal_lm, temperature):
    b = grouped_batch(tiny_causal_lm.config.vocab_size, seed=1)
    with torch.no_grad():
        plain = response_token_outputs(tiny_causal_lm, b, temperature, calculate_entropy=True, packed=False)
        grouped = response_token_outputs(tiny_causal_lm, b, temperature, calculate_entropy=True, prefix_grouping=True)
    mask = b["response_mask"].bool()
    assert torch.allclose(grouped["log_probs"][mask], plain["log_probs"][mask], atol=1e-5)
    assert torch.allclose(grouped["entropy"][mask], plain["entropy"][mask], atol=1e-5)
    assert (grouped["log_probs"][~mask] == 0).all()


def test_gradients_equal_the_ungrouped_forward(tiny_causal_lm):
    model = tiny_causal_lm
    b = grouped_batch(model.config.vocab_size, seed=2)
    weights = torch.randn(b["responses"].shape, generator=torch.Generator().manual_seed(3)) * b["response_mask"]

    def grads(**kw):
        model.zero_grad(set_to_none=True)
        out = response_token_outputs(model, b, 1.0, calculate_entropy=True, **kw)
        ((out["log_probs"] + 0.1 * out["entropy"]) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, grouped = grads(packed=False), grads(prefix_grouping=True)
    model.zero_grad(set_to_none=True)
    assert plain.keys() == grouped.keys() and len(plain) > 5
    for name in plain:
        assert torch.allclose(grouped[name], plain[name], atol=1e-5, rtol=1e-4), name


def test_sliding_window_layers_keep_their_window():
    """A model whose window is shorter than the rows: the grouped mask must apply it by position, as transformers
    does for the ordinary forward."""
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    model = build_tiny_model(build_char_tokenizer(), size="nano", family="mistral", sliding_window=3).eval()
    model.config._attn_implementation = "sdpa"
    b = grouped_batch(model.config.vocab_size, seed=4)
    with torch.no_grad():
        plain = response_token_outputs(model, b, 1.0, packed=False)["log_probs"]
        grouped = response_token_outputs(model, b, 1.0, prefix_grouping=True)["log_probs"]
        model.config.sliding_window = None  # without the window the numbers differ: the test can tell
        unwindowed = response_token_outputs(model, b, 1.0, packed=False)["log_probs"]
    mask = b["response_mask"].bool()
    assert torch.allclose(grouped[mask], plain[mask], atol=1e-5)
    assert not torch.allclose(unwindowed[mask], plain[mask], atol=1e-3)


def test_attention_without_additive_masks_is_refused(tiny_causal_lm):
    b = grouped_batch(tiny_causal_lm.config.vocab_size)
    impl = tiny_causal_lm.config._attn_implementation
    tiny_causal_lm.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match=r"use_prefix_grouper=true needs sdpa or eager attention"):
            response_token_outputs(tiny_causal_lm, b, 1.0, prefix_grouping=True)
    finally:
        tiny_causal_lm.config._attn_implementation = impl
