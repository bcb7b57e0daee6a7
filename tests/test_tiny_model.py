"""The locally built char tokenizer: extra whole-word tokens (tool tags) survive save/load and decoding."""

from __future__ import annotations

from transformers import AutoTokenizer

from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model


def test_added_tokens_are_single_non_special_tokens_after_a_round_trip(tmp_path):
    tags = ("<tool_call>", "</tool_call>")
    tok = build_char_tokenizer(added_tokens=tags)
    build_tiny_model(tok, size="nano").save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = '<tool_call>{"a": 1}</tool_call> x\n'
    for t in (tok, loaded):
        ids = t.encode(text, add_special_tokens=False)
        assert len(ids) == len(text) - sum(len(tag) for tag in tags) + 2  # each tag one token, the rest chars
        assert t.decode(ids, skip_special_tokens=True) == text  # not special: kept when specials are dropped
    assert tok.encode(text, add_special_tokens=False) == loaded.encode(text, add_special_tokens=False)
    assert len(build_char_tokenizer()) == len(tok) - 2


def test_deepseek_v3s_routing_bias_is_spread_saved_and_changes_the_output(tmp_path):
    """The family table's ``init_weights``: a random init leaves DeepSeek-V3's ``e_score_correction_bias`` at zero,
    where the group-limited selection would never depend on it."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    model = AutoModelForCausalLM.from_pretrained(make_tiny_checkpoint(tmp_path, size="nano", family="deepseek-v3"))
    routers = [m for m in model.modules() if hasattr(m, "e_score_correction_bias")]
    assert routers and all(len(set(r.e_score_correction_bias.tolist())) == r.e_score_correction_bias.numel()
                           for r in routers)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        biased = model(ids).logits
        for router in routers:
            router.e_score_correction_bias.zero_()
        assert not torch.allclose(model(ids).logits, biased)  # other experts were chosen
