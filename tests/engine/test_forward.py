"""Padding-free (packed) and trimmed forwards give the padded forward's log-probs, entropies, values."""

import pytest
import torch

from hybridflow.engine.forward import last_token_scores, response_log_probs, response_values, use_packed_layout


def test_packed_and_trimmed_log_probs_match_padded(tiny_causal_lm, batches):
    model = tiny_causal_lm
    data = batches.make_rollout_batch(model.config.vocab_size, batch_size=5, prompt_len=7, response_len=6, seed=1)
    with torch.no_grad():
        ref = batches.padded_reference_log_probs(model, data, temperature=0.7)
        packed, ent_p = response_log_probs(model, data.batch, 0.7, calculate_entropy=True, packed=True)
        trimmed, ent_t = response_log_probs(model, data.batch, 0.7, calculate_entropy=True, packed=False)
        auto, ent_a = response_log_probs(model, data.batch, 0.7, calculate_entropy=True, use_remove_padding=True)
    mask = data.batch["response_mask"].bool()
    assert torch.allclose(packed[mask], ref[mask], atol=1e-5)
    assert torch.allclose(trimmed[mask], ref[mask], atol=1e-5)
    assert torch.allclose(auto[mask], packed[mask], atol=1e-5)  # CPU, sdpa: use_remove_padding packs
    assert torch.allclose(ent_p[mask], ent_t[mask], atol=1e-5)
    assert torch.allclose(ent_a[mask], ent_p[mask], atol=1e-5)
    assert (ent_p[mask] > 0).all()


def test_packing_where_attention_stays_within_each_sequence(tiny_causal_lm):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    impl = tiny_causal_lm.config._attn_implementation
    try:
        tiny_causal_lm.config._attn_implementation = "sdpa"
        assert use_packed_layout(tiny_causal_lm, cpu, True)  # padded attention (engine/padded_attention.py)
        assert use_packed_layout(tiny_causal_lm, cuda, True)
        assert not use_packed_layout(tiny_causal_lm, cuda, False)  # the user asked for the padded layout
        tiny_causal_lm.config._attn_implementation = "eager"
        assert not use_packed_layout(tiny_causal_lm, cpu, True)  # block-diagonal N x N mask: slower than trimming
        tiny_causal_lm.config._attn_implementation = "flash_attention_2"
        assert use_packed_layout(tiny_causal_lm, cuda, True)
        assert not use_packed_layout(tiny_causal_lm, cpu, True)
    finally:
        tiny_causal_lm.config._attn_implementation = impl


def test_entropy_as_a_metric_has_no_graph(tiny_causal_lm, batches):
    data = batches.make_rollout_batch(tiny_causal_lm.config.vocab_size, batch_size=2, seed=4)
    lp, ent = response_log_probs(tiny_causal_lm, data.batch, 1.0, calculate_entropy=True, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    _, ent_g = response_log_probs(tiny_causal_lm, data.batch, 1.0, calculate_entropy=True)
    assert ent_g.requires_grad and torch.allclose(ent, ent_g.detach(), atol=1e-6)


def test_packed_log_probs_have_gradients(tiny_causal_lm, batches):
    model = tiny_causal_lm
    data = batches.make_rollout_batch(model.config.vocab_size, batch_size=3, seed=2)
    lp, _ = response_log_probs(model, data.batch, 1.0, packed=True)
    (lp * data.batch["response_mask"]).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    model.zero_grad(set_to_none=True)


def test_temperature_must_be_positive(tiny_causal_lm, batches):
    data = batches.make_rollout_batch(tiny_causal_lm.config.vocab_size, batch_size=2)
    try:
        response_log_probs(tiny_causal_lm, data.batch, 0.0)
    except ValueError as e:
        assert "temperature" in str(e)
    else:
        raise AssertionError("temperature 0 must be rejected")


def test_values_and_last_token_scores_match_padded(tiny_model_dir, batches):
    from hybridflow.engine.model_loader import load_reward_model, load_value_model

    critic = load_value_model(tiny_model_dir).eval()
    data = batches.make_rollout_batch(critic.config.vocab_size, batch_size=4, seed=3)
    b = data.batch
    with torch.no_grad():
        padded = critic(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits[..., 0]
        R = b["responses"].shape[1]
        expect = padded[:, -R - 1 : -1]
        mask = b["response_mask"].bool()
        for packed in (True, False):
            got = response_values(critic, b, use_remove_padding=packed)
            assert torch.allclose(got[mask], expect[mask], atol=1e-5)

    rm = load_reward_model(tiny_model_dir).eval()
    with torch.no_grad():
        scores = last_token_scores(rm, b["input_ids"], b["attention_mask"], b["position_ids"])
        for i in range(4):  # each row alone, unpadded: the score of its last token
            keep = b["attention_mask"][i].bool()
            ids = b["input_ids"][i][keep][None]
            alone = rm(input_ids=ids).logits[0, 0]
            assert torch.allclose(scores[i], alone, atol=1e-5)


@pytest.mark.parametrize("packed", [True, False])
def test_only_response_positions_are_projected_with_or_without_logits_to_keep(tiny_causal_lm, batches, packed):
    """The vocabulary projection runs on the response positions only (``logits_to_keep``), or -- for a
    model whose forward lacks that argument -- on all positions and is sliced; both give the padded result."""
    from hybridflow.engine import forward

    data = batches.make_rollout_batch(tiny_causal_lm.config.vocab_size, batch_size=4, prompt_len=6, response_len=5, seed=6)
    mask = data.batch["response_mask"].bool()
    seen = []
    hook = tiny_causal_lm.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.shape[1]))
    accepts = forward._accepts_logits_to_keep
    try:
        with torch.no_grad():
            ref = batches.padded_reference_log_probs(tiny_causal_lm, data, temperature=0.9)
            seen.clear()
            fast, _ = response_log_probs(tiny_causal_lm, data.batch, 0.9, packed=packed)
            projected_fast = seen[-1]
            forward._accepts_logits_to_keep = lambda module: False  # a model whose forward has no logits_to_keep
            sliced, _ = response_log_probs(tiny_causal_lm, data.batch, 0.9, packed=packed)
            projected_all = seen[-1]
    finally:
        hook.remove()
        forward._accepts_logits_to_keep = accepts
    assert torch.allclose(fast[mask], ref[mask], atol=1e-5)
    assert torch.allclose(sliced[mask], ref[mask], atol=1e-5)
    assert projected_fast < projected_all  # the prompt positions were not projected


def test_sum_pi_squared_comes_from_the_same_pass_and_matches_the_softmax(tiny_causal_lm, batches):
    """Σ_v π_T(v)² per response token (OTB's input) equals the softmax of the padded forward's logits / T."""
    from hybridflow.engine.forward import response_token_outputs

    data = batches.make_rollout_batch(tiny_causal_lm.config.vocab_size, batch_size=3, prompt_len=5, response_len=4,
                                      seed=7)
    b = data.batch
    with torch.no_grad():
        outs = response_token_outputs(tiny_causal_lm, b, 0.8, calculate_sum_pi_squared=True, packed=False)
        logits = tiny_causal_lm(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                position_ids=b["position_ids"]).logits[:, -5:-1] / 0.8
    expected = torch.softmax(logits.float(), dim=-1).pow(2).sum(-1)
    mask = b["attention_mask"][:, -4:].bool()
    assert set(outs) == {"log_probs", "sum_pi_squared"} and not outs["sum_pi_squared"].requires_grad
    assert torch.allclose(outs["sum_pi_squared"][mask], expected[mask], atol=1e-6)
