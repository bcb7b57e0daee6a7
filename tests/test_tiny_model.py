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
