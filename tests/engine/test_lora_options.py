"""verl's Megatron LoRA node on peft adapters: module names translated, initialisation, dropout and DoRA applied,
values without a counterpart refused (``engine/lora_options.py``)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from hybridflow.engine.lora_options import LoraOptions, hf_module_names, lora_node_problems
from hybridflow.engine.model_loader import apply_lora
from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

NODE = dict(type="lora", rank=8, alpha=16, dropout=0.0, dropout_position="pre", lora_A_init_method="xavier",
            lora_B_init_method="zero", dtype=None, freeze_vision_model=True, freeze_vision_projection=True,
            freeze_language_model=True)


def model():
    return build_tiny_model(build_char_tokenizer(), size="tiny", seed=0)


def test_megatron_module_names_are_transformers_names():
    names, problems = hf_module_names(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], "k")
    assert problems == [] and names == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert hf_module_names(["linear_kv_up_proj", "router"], "k")[0] == ["gate", "kv_b_proj"]
    pattern, _ = hf_module_names(["*.layers.0.*.linear_qkv"], "k")
    assert re.fullmatch(pattern, "model.layers.0.self_attn.k_proj")
    assert not re.fullmatch(pattern, "model.layers.1.self_attn.k_proj")
    assert not re.fullmatch(pattern, "model.layers.0.self_attn.o_proj")
    _, problems = hf_module_names(["linear_qkvv"], "actor_rollout_ref.model.lora.target_modules")
    assert "'linear_qkvv' is not a module name this engine knows" in problems[0]


def test_wildcard_targets_reach_only_the_named_layer():
    pattern, _ = hf_module_names(["*.layers.0.*.linear_qkv"], "k")
    peft_model = apply_lora(model(), 4, 8.0, pattern)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in peft_model.named_parameters() if ".lora_A." in n}
    assert adapted and all(".layers.0.self_attn." in n for n in adapted)
    assert {n.rsplit(".", 1)[-1] for n in adapted} == {"q_proj", "k_proj", "v_proj"}


def _adapters(peft_model, attr):
    return [m for name, m in peft_model.named_modules() if name.endswith(f"{attr}.default")]


@pytest.mark.parametrize("method,bound", [("xavier", lambda fan_in, r: math.sqrt(6 / (fan_in + r))),
                                          ("kaiming", lambda fan_in, r: 1 / math.sqrt(fan_in))])
def test_a_initialisation_follows_the_method(method, bound):
    torch.manual_seed(0)
    peft_model = apply_lora(model(), 8, 16.0, ["q_proj"], options=LoraOptions(init_a=method))
    for a in _adapters(peft_model, "lora_A"):
        r, fan_in = a.weight.shape
        limit = bound(fan_in, r)
        assert a.weight.abs().max() <= limit + 1e-6
        assert a.weight.abs().max() > 0.8 * limit  # uniform over the whole range (xavier's is wider than kaiming's)
    assert all(torch.count_nonzero(b.weight) == 0 for b in _adapters(peft_model, "lora_B"))


def test_b_initialisation_and_dropout_and_dora_reach_peft():
    base = model()
    ids = torch.randint(0, 40, (1, 12))
    with torch.no_grad():
        ref = base(ids).logits
    peft_model = apply_lora(base, 8, 16.0, ["q_proj", "v_proj"],
                            options=LoraOptions(dropout=0.25, use_dora=True, init_b="xavier"))
    cfg = peft_model.peft_config["default"]
    assert cfg.lora_dropout == 0.25 and cfg.use_dora
    peft_model.eval()
    with torch.no_grad():
        out = peft_model(ids).logits
    assert not torch.allclose(out, ref, atol=1e-4)  # a non-zero B changes the model from the start
    zero = apply_lora(model(), 8, 16.0, ["q_proj"], options=LoraOptions(init_b="zero")).eval()
    with torch.no_grad():
        assert torch.allclose(zero(ids).logits, ref, atol=1e-5)


@pytest.mark.parametrize("change,message", [
    (dict(dropout_position="post"), r"dropout_position='post': peft applies the dropout to the adapter's input"),
    (dict(type="vlm_lora"), r"type='vlm_lora': choose lora, canonical_lora"),
    (dict(lora_A_init_method="orthogonal"), r"lora_A_init_method='orthogonal': choose one of xavier"),
    (dict(dtype="bf16"), r"dtype='bf16': the adapters are kept in the model's dtype"),
    (dict(freeze_language_model=False), r"freeze_language_model=false: with LoRA every base weight stays frozen"),
])
def test_values_without_a_counterpart_are_refused(change, message):
    problems = lora_node_problems({**NODE, **change}, "actor_rollout_ref.model.lora")
    assert len(problems) == 1 and re.search(message, problems[0])
    assert lora_node_problems(NODE, "actor_rollout_ref.model.lora") == []
