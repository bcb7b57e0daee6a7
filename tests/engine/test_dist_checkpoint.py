"""Starting a model from a torch distributed checkpoint (verl's megatron.use_dist_checkpointing): a DCP folder of a
transformers state dict, and one in Megatron-core's GPT names (per layer or layer-stacked, fused qkv per query group,
fused gate/up), load into the model ``model.path`` describes, tensor for tensor."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed.checkpoint as dcp

from hybridflow.engine.dist_checkpoint import DistCheckpointError, load_dist_checkpoint, start_from_dist_checkpoint
from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

FIELD = "actor_rollout_ref.actor.megatron.dist_checkpointing_path"


def tiny(family, seed):
    return build_tiny_model(build_char_tokenizer(), size="nano", family=family, seed=seed)


def save(state, path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({k: v.contiguous() for k, v in state.items()}, checkpoint_id=str(path), no_dist=True)
    return str(path)


def to_megatron(model, stacked: bool) -> dict[str, torch.Tensor]:
    """The test's own writer of Megatron-core GPT names (what a torch_dist folder of verl's converter holds)."""
    cfg = model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    sd = model.state_dict()
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = sd["lm_head.weight"]
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        layer = {"self_attention.linear_proj.weight": sd[p + "self_attn.o_proj.weight"],
                 "self_attention.linear_qkv.layer_norm_weight": sd[p + "input_layernorm.weight"],
                 "mlp.linear_fc1.layer_norm_weight": sd[p + "post_attention_layernorm.weight"],
                 "mlp.linear_fc1.weight": torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]),
                 "mlp.linear_fc2.weight": sd[p + "mlp.down_proj.weight"]}
        for kind in ("weight", "bias"):
            if p + f"self_attn.q_proj.{kind}" not in sd:
                continue
            q, k, v = (sd[p + f"self_attn.{n}_proj.{kind}"] for n in "qkv")
            groups = []
            for g in range(kv):  # per query group: its query heads, then its key and value head
                per = heads // kv
                groups += [q[g * per * head_dim:(g + 1) * per * head_dim], k[g * head_dim:(g + 1) * head_dim],
                           v[g * head_dim:(g + 1) * head_dim]]
            layer[f"self_attention.linear_qkv.{kind}"] = torch.cat(groups)
        for n in ("q", "k"):
            if p + f"self_attn.{n}_norm.weight" in sd:
                layer[f"self_attention.{n}_layernorm.weight"] = sd[p + f"self_attn.{n}_norm.weight"]
        layers.append(layer)
    if stacked:
        out.update({f"decoder.layers.{k}": torch.stack([layer[k] for layer in layers]) for k in layers[0]})
    else:
        out.update({f"decoder.layers.{i}.{k}": v for i, layer in enumerate(layers) for k, v in layer.items()})
    return out


def assert_same(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("prefix", ["", "model."])
def test_a_dcp_of_a_transformers_state_dict_starts_the_model(tmp_path, prefix):
    source, fresh = tiny("qwen2.5", 1), tiny("qwen2.5", 2)
    path = save({prefix + k: v for k, v in source.state_dict().items()}, tmp_path / "ckpt")
    load_dist_checkpoint(fresh, path, FIELD)
    assert_same(fresh, source)


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3.1"])
@pytest.mark.parametrize("stacked", [False, True])
def test_megatron_core_names_map_onto_transformers(tmp_path, family, stacked):
    """GQA (4 query heads over 2 key/value groups), qkv biases (Qwen2.5), per-head norms (Qwen3), an untied head
    (Llama-3.1): Megatron's fused layout cut back exactly."""
    source, fresh = tiny(family, 1), tiny(family, 2)
    path = save(to_megatron(source, stacked), tmp_path / "mcore")
    load_dist_checkpoint(fresh, path, FIELD)
    assert_same(fresh, source)


def test_problems_name_the_key_and_the_tensor(tmp_path):
    model = tiny("qwen2.5", 0)
    with pytest.raises(DistCheckpointError, match=rf"{FIELD}='' is not a torch distributed checkpoint folder"):
        load_dist_checkpoint(model, "", FIELD)
    state = to_megatron(model, stacked=False)
    state["decoder.layers.0.mlp.experts.linear_fc1.weight0"] = torch.zeros(2, 2)
    with pytest.raises(DistCheckpointError, match=r"no transformers tensor for the Megatron keys "
                                                  r"\['decoder.layers.0.mlp.experts.linear_fc1.weight0'\]"):
        load_dist_checkpoint(model, save(state, tmp_path / "moe"), FIELD)
    bigger = build_tiny_model(build_char_tokenizer(), size="tiny", family="qwen2.5")
    with pytest.raises(DistCheckpointError, match=r"tensor 'model.embed_tokens.weight' has shape \(\d+, 128\) in the "
                                                  r"checkpoint and \(\d+, 64\) in the model"):
        load_dist_checkpoint(model, save(bigger.state_dict(), tmp_path / "bigger"), FIELD)
    with pytest.raises(DistCheckpointError, match=r"neither this model's \(transformers\) nor Megatron-core's"):
        load_dist_checkpoint(tiny("qwen3", 0), save(model.state_dict(), tmp_path / "other"), FIELD)


def test_only_a_megatron_role_with_the_flag_starts_from_it(tmp_path):
    source = tiny("qwen2.5", 1)
    path = save(source.state_dict(), tmp_path / "ckpt")
    node = SimpleNamespace(use_dist_checkpointing=True, dist_checkpointing_path=path)
    fsdp_role = SimpleNamespace(strategy="fsdp", megatron=node)
    fresh = tiny("qwen2.5", 2)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    start_from_dist_checkpoint(fresh, fsdp_role, "actor_rollout_ref.actor")  # the megatron node is inert there
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    start_from_dist_checkpoint(fresh, SimpleNamespace(strategy="megatron", megatron=node), "actor_rollout_ref.actor")
    assert_same(fresh, source)
