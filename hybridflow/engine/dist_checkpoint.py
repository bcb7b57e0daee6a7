"""Start a model from a distributed checkpoint (verl's ``<role>.megatron.use_dist_checkpointing`` /
``dist_checkpointing_path``) instead of the safetensors in ``model.path``.

verl's Megatron engine reads Megatron-core's ``dist_checkpointing`` folders, whose ``torch_dist`` backend *is* a torch
distributed checkpoint (DCP: a ``.metadata`` file and ``__<rank>_<i>.distcp`` shards, any layout).  This module reads
any DCP folder -- every rank reads the whole tensors it needs, whatever layout wrote them -- and maps its names onto
the transformers model built from ``model.path`` (whose ``config.json`` still gives the architecture):

* **transformers names** (a DCP save of a transformers model's state dict, as VeOmni's and TorchTitan's ``dcp``
  checkpoints hold, optionally under a ``model.`` prefix): loaded as they are;
* **Megatron-core names** of the GPT decoder (Llama / Qwen2 / Qwen3 / Mistral; the ``torch_dist`` folders verl's
  ``scripts/converter_hf_to_mcore.py`` writes): ``embedding.word_embeddings``, ``decoder.layers.<i>.*`` or the
  layer-stacked ``decoder.layers.*`` (a leading layer dimension), ``decoder.final_layernorm``, ``output_layer``.
  The fused ``linear_qkv`` is stored per query group ([q heads of the group | k | v] rows), ``linear_fc1`` is
  [gate | up]; both are cut back into transformers' projections.

A tensor of the model the checkpoint does not hold, or a checkpoint tensor no rule maps, is an error naming the key
(MoE experts in Megatron's layout are not mapped: convert such a checkpoint to transformers names first).
"""

from __future__ import annotations

import os
import re
import warnings

import torch
from torch import nn

__all__ = ["DistCheckpointError", "is_dist_checkpoint", "load_dist_checkpoint", "megatron_to_hf", "read_dcp",
           "start_from_dist_checkpoint"]


class DistCheckpointError(ValueError):
    """A distributed checkpoint that cannot start this model (the message names the folder, the key and a fix)."""


def is_dist_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(os.path.expanduser(path), ".metadata"))


def read_dcp(path: str) -> dict[str, torch.Tensor]:
    """Every tensor of the DCP folder ``path``, whole, on the CPU (no process group needed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = os.path.expanduser(path)
    metadata = FileSystemReader(path).read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items() if isinstance(meta, TensorStorageMetadata)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path, no_dist=True)
    return state


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_PLAIN = {"self_attention.linear_proj.weight": "self_attn.o_proj.weight",
          "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
          "input_layernorm.weight": "input_layernorm.weight",
          "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
          "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
          "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
          "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
          "mlp.linear_fc2.weight": "mlp.down_proj.weight"}


def _split_qkv(fused: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """Megatron's per-group [q (heads / kv_heads heads) | k | v] rows -> transformers' q, k, v."""
    per_group = heads // kv_heads
    grouped = fused.reshape(kv_heads, per_group + 2, head_dim, *fused.shape[1:])
    q = grouped[:, :per_group].reshape(heads * head_dim, *fused.shape[1:])
    k = grouped[:, per_group].reshape(kv_heads * head_dim, *fused.shape[1:])
    v = grouped[:, per_group + 1].reshape(kv_heads * head_dim, *fused.shape[1:])
    return q, k, v


def _unstack(state: dict[str, torch.Tensor], layers: int) -> dict[str, torch.Tensor]:
    """Layer-stacked keys (``decoder.layers.X`` with a leading dimension of ``layers``) -> one key per layer."""
    out = {}
    for key, value in state.items():
        if key.startswith("decoder.layers.") and not _LAYER.match(key) and value.dim() and value.shape[0] == layers:
            rest = key[len("decoder.layers."):]
            out.update({f"decoder.layers.{i}.{rest}": value[i] for i in range(layers)})
        else:
            out[key] = value
    return out


def megatron_to_hf(state: dict[str, torch.Tensor], config) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``(transformers state dict, Megatron keys no rule maps)`` for a GPT decoder of ``config`` (its text config)."""
    heads, kv = int(config.num_attention_heads), int(config.num_key_value_heads or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    out: dict[str, torch.Tensor] = {}
    unmapped = []
    for key, value in _unstack(state, int(config.num_hidden_layers)).items():
        match = _LAYER.match(key)
        top = {"embedding.word_embeddings.weight": "model.embed_tokens.weight", "output_layer.weight": "lm_head.weight",
               "decoder.final_layernorm.weight": "model.norm.weight"}.get(key)
        if top:
            out[top] = value
            continue
        if match is None:
            unmapped.append(key)
            continue
        prefix, rest = f"model.layers.{match.group(1)}", match.group(2)
        if rest in _PLAIN:
            out[f"{prefix}.{_PLAIN[rest]}"] = value
        elif rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
            kind = rest.rsplit(".", 1)[-1]
            for name, part in zip(("q_proj", "k_proj", "v_proj"), _split_qkv(value, heads, kv, head_dim)):
                out[f"{prefix}.self_attn.{name}.{kind}"] = part
        elif rest == "mlp.linear_fc1.weight":
            gate, up = value.chunk(2, dim=0)
            out[f"{prefix}.mlp.gate_proj.weight"], out[f"{prefix}.mlp.up_proj.weight"] = gate, up
        else:
            unmapped.append(key)
    return out, unmapped


def _hf_state(state: dict[str, torch.Tensor], model: nn.Module, path: str, field: str,
              keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    own = {k: v for k, v in model.state_dict().items() if not k.startswith(keep)}
    for prefix in ("", "model."):  # a transformers state dict, bare or under {"model": ...}
        renamed = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if set(own) <= set(renamed):
            return {k: renamed[k] for k in own}
    if not any(k.startswith(("decoder.", "embedding.")) for k in state):
        missing = sorted(set(own) - set(state))
        raise DistCheckpointError(f"{field}={path!r}: the checkpoint's tensors are neither this model's (transformers) "
                                  f"nor Megatron-core's GPT names; the model's {missing[:3]} are not in it")
    from hybridflow.engine.transformers_adapter import text_config

    mapped, unmapped = megatron_to_hf(state, text_config(model.config))
    if unmapped:
        raise DistCheckpointError(f"{field}={path!r}: no transformers tensor for the Megatron keys {unmapped[:4]} (MoE "
                                  "experts and non-GPT blocks are not mapped): convert the checkpoint to a Hugging Face "
                                  "folder and start from actor_rollout_ref.model.path")
    if "lm_head.weight" in own and "lm_head.weight" not in mapped and "model.embed_tokens.weight" in mapped:
        mapped["lm_head.weight"] = mapped["model.embed_tokens.weight"]  # a tied head is not stored twice
    missing = sorted(set(own) - set(mapped))
    if missing:
        raise DistCheckpointError(f"{field}={path!r}: the model's tensors {missing[:4]} are not in the checkpoint")
    return {k: mapped[k] for k in own}


@torch.no_grad()
def load_dist_checkpoint(model: nn.Module, path: str, field: str, keep: tuple[str, ...] = ()) -> None:
    """Overwrite ``model``'s weights (a transformers module, before any parallelism) with the checkpoint's; shapes
    must match the architecture ``model.path``'s ``config.json`` gives.  Tensors whose names start with ``keep`` (a
    critic's value head, which a policy checkpoint has not) keep their values."""
    if not path or not is_dist_checkpoint(path):
        raise DistCheckpointError(f"{field}={path!r} is not a torch distributed checkpoint folder (no .metadata file): "
                                  "point it at a Megatron torch_dist / DCP folder, or set use_dist_checkpointing=false "
                                  "to start from the safetensors in the model path")
    state = _hf_state(read_dcp(path), model, path, field, keep)
    own = model.state_dict()
    for name, value in state.items():
        if tuple(value.shape) != tuple(own[name].shape):
            raise DistCheckpointError(f"{field}={path!r}: tensor {name!r} has shape {tuple(value.shape)} in the "
                                      f"checkpoint and {tuple(own[name].shape)} in the model built from its config.json")
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=not keep)


def start_from_dist_checkpoint(model: nn.Module, role: object, key: str, keep: tuple[str, ...] = ()) -> None:
    """A ``strategy=megatron`` role with ``megatron.use_dist_checkpointing`` starts from ``dist_checkpointing_path``
    (``key``: the role's config prefix); any other role keeps the weights it loaded."""
    node = getattr(role, "megatron", None)
    if getattr(role, "strategy", None) == "megatron" and node is not None and node.use_dist_checkpointing:
        load_dist_checkpoint(model, node.dist_checkpointing_path, f"{key}.megatron.dist_checkpointing_path", keep)
