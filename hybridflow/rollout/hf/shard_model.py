"""One rank's shard of the rollout model: the training plans applied to a model built without storage.

The rollout splits the model over its shard group (``k`` ranks, a 1-D device mesh) the way training splits it over
tp (``engine/tensor_parallel.py``: query / key / value heads and MLP columns column-wise, output projections
row-wise, the embedding and the LM head over the vocabulary) and, for a MoE model, its routed experts over the same
``k`` ranks (``engine/expert_parallel.py``; the ranks of a group hold the same tokens, so each dispatches its 1/k of
them and the outputs are gathered, as training does when its expert groups span tp).

The model is built on the ``meta`` device, split, and only then given storage (``to_empty``): a rank never holds
more than its shard, even while the engine is built.  Its parameters are empty until the switch fills them
(``engine/reshard.switch_to_rollout``); the buffers the state dict does not carry (rotary frequencies) are copied
from the training module, which holds them whole.

The LM head's output, sharded over the vocabulary, is gathered (``(rows, V)`` of the last positions: what the
sampler needs) by a forward hook (:func:`gathered_logits`): the engine samples from whole logits, the same on every
rank of the group.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from hybridflow.engine.expert_parallel import apply_expert_parallel
from hybridflow.engine.tensor_parallel import apply_tensor_parallel
from hybridflow.engine.transformers_adapter import attention_implementation, moe_experts

__all__ = ["KEY", "build_model_shard", "gathered_logits", "non_persistent_buffers"]

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def _gather_hook(_module, _args, output):
    return output.full_tensor() if hasattr(output, "full_tensor") else output


@contextlib.contextmanager
def gathered_logits(model: nn.Module) -> Iterator[nn.Module]:
    """While inside: the output of ``model``'s LM head, sharded over the vocabulary, is gathered whole."""
    handle = model.get_output_embeddings().register_forward_hook(_gather_hook)
    try:
        yield model
    finally:
        handle.remove()


def non_persistent_buffers(model: nn.Module) -> list[str]:
    """Names of the buffers ``model.state_dict()`` leaves out (computed at construction: rotary frequencies)."""
    persistent = set(model.state_dict())
    return [name for name, _ in model.named_buffers() if name not in persistent]


def build_model_shard(config, mesh, device: torch.device | str, dtype: torch.dtype,
                      buffers_from: nn.Module) -> nn.Module:
    """The model of ``config`` split over ``mesh`` (the rollout shard group), this rank's storage only, in eval mode
    with its logits gathered; parameters uninitialised (filled by the switch), buffers copied from ``buffers_from``."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                 attn_implementation=attention_implementation(config))
    k = mesh.size()
    if moe_experts(model):
        apply_expert_parallel(model, mesh, KEY, tp_split=(mesh.get_group(), k, mesh.get_local_rank()))
    apply_tensor_parallel(model, mesh, KEY)
    model.to_empty(device=device)
    _copy_buffers(model, buffers_from, non_persistent_buffers(model))
    model.requires_grad_(False)
    model.eval()
    model.get_output_embeddings().register_forward_hook(_gather_hook)
    return model


def _copy_buffers(model: nn.Module, source: nn.Module, names: list[str]) -> None:
    held = dict(source.named_buffers())
    held.update(_peer_buffers(held, names))
    missing = [n for n in names if n not in held]
    if missing:
        raise ValueError(f"{KEY}>1: no training rank holds the buffer {missing[0]!r} to copy into the rollout's "
                         "shard (a model whose layers compute buffers the training views lack)")
    with torch.no_grad():
        for name in names:
            target = model.get_buffer(name)
            target.copy_(held[name].to(device=target.device, dtype=target.dtype))


def _peer_buffers(held: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """The buffers some rank lacks, from the ranks that hold them (a collective of every rank: under pipeline
    parallelism a stage keeps only its own modules, e.g. Gemma-2's ``embed_scale`` lives on the first stage)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}
    lacking: list[list[str]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(lacking, [n for n in names if n not in held])
    wanted = sorted({n for names_ in lacking for n in names_})
    if not wanted:  # every rank holds every buffer it needs: the usual case, one small exchange
        return {}
    offers: list[dict[str, torch.Tensor]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(offers, {n: held[n].detach().cpu() for n in wanted if n in held})
    found: dict[str, torch.Tensor] = {}
    for offer in offers:
        for n, t in offer.items():
            found.setdefault(n, t)
    return {n: t for n, t in found.items() if n not in held}
