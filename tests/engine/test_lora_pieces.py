"""A LoRA actor's weights read piece by piece for the switch (``engine/lora_pieces.py``): plain names, each wrapped
weight's box equal to the same box of peft's ``merge_and_unload``."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engine import lora_pieces, shard_switch
from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="module")
def peft_and_merged():
    from hybridflow.engine.model_loader import apply_lora

    torch.manual_seed(0)
    model = build_tiny_model(build_char_tokenizer(), size="nano", family="qwen2")
    peft = apply_lora(model, 4, 8.0, "all-linear")
    with torch.no_grad():  # B starts at 0: give the adapters something to merge
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    import copy

    merged = copy.deepcopy(peft).merge_and_unload().state_dict()
    return peft, merged


def test_names_are_plain_and_every_merged_weight_equals_peft(peft_and_merged):
    peft, merged = peft_and_merged
    state = lora_pieces.training_state(peft)
    assert isinstance(state, lora_pieces.MergedTrainingState)
    assert not [n for n in state if "lora_" in n or "base_layer" in n or n.startswith("base_model.")]
    assert set(state) <= set(merged) and "model.layers.0.self_attn.q_proj.weight" in state
    changed = 0
    for name in state:
        torch.testing.assert_close(state[name], merged[name], rtol=0, atol=1e-6, msg=name)
        changed += not torch.equal(state.stored(name), merged[name])
    assert changed >= 7 * 2  # every linear of both layers was wrapped and its merge differs from the base


def test_a_box_is_the_same_box_of_the_merged_weight(peft_and_merged, monkeypatch):
    """A rank holding rows 3..9 and columns 5..40 of q_proj gets exactly that box of the merged matrix."""
    peft, merged = peft_and_merged
    state = lora_pieces.training_state(peft)
    name = "model.layers.1.mlp.down_proj.weight"
    whole, layers = state._sources[name]
    box = ((3, 9), (5, 40))
    piece = whole[3:9, 5:40]
    monkeypatch.setattr(shard_switch, "local_box", lambda tensor: box)
    got = lora_pieces._merged_piece(piece, layers)
    torch.testing.assert_close(got, merged[name][3:9, 5:40], rtol=0, atol=1e-6)
    assert not torch.allclose(got, piece)  # the adapter's delta is in it


def test_a_plain_model_reads_its_state(peft_and_merged):
    model = build_tiny_model(build_char_tokenizer(), size="nano", family="qwen2")
    state = lora_pieces.training_state(model)
    assert not isinstance(state, lora_pieces.MergedTrainingState)
    assert "model.layers.0.self_attn.q_proj.weight" in state
