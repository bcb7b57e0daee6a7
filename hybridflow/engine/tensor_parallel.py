"""Tensor parallelism (Megatron-LM's intra-layer split, Shoeybi et al. 2019, arXiv:1909.08053) with DTensor
``parallelize_module`` plans, for the decoder families hybridflow supports.

The ``tp`` ranks of a group hold the same rows and split every layer's weights:

* **attention** -- ``q/k/v`` projections column-wise (each rank computes its H/tp query heads and n_kv/tp
  key/value heads end to end: rotary embedding, per-head norms, attention), the output projection row-wise (each
  rank's partial product is summed over the group: one all-reduce);
  DeepSeek's latent attention splits its up-projections (``q_b_proj``, ``kv_b_proj``) the same way and keeps the
  small low-rank down-projections whole;
* **MLP** -- ``gate``/``up`` column-wise, ``down`` row-wise (one all-reduce); a MoE layer's router stays whole,
  its shared experts split like an MLP, its routed experts are expert-parallel (``engine/expert_parallel.py``);
* **embedding** -- split over the vocabulary (each rank looks up the ids in its range, zeros elsewhere, summed
  over the group);
* **LM head** -- split over the vocabulary: the logits stay a ``DTensor`` sharded on the vocabulary dimension and
  log-probs / entropy are computed from the shards without ever gathering a (tokens x vocab) tensor
  (``engine/vocab_parallel.py``);
* everything else (norms, the critic's score head) is whole on every rank and computes the same thing there --
  unless ``sequence_parallel`` (Megatron's, ``engine/tp_sequence.py``) splits the layers' norms and residual stream
  along the tokens inside the group.

LoRA adapters (peft) on a split projection follow its split, so that ``base(x) + B(A(x))`` stays a sum of two
pieces laid out alike: on a column-wise projection ``A`` is whole on every rank and ``B`` is split on its output
features like the base weight; on a row-wise one ``A`` is split on its input features (its product is summed over
the group) and ``B`` is whole.  An adapter on a projection that stays whole is whole too.  Adapters on the
vocabulary-split embedding or LM head, and on MoE experts, are refused (no split is built for them).

The backward needs no code of its own: the column-wise layers' input redistribution sums the partial input
gradients over the group (Megatron's "f"), the row-wise layers' output all-reduce passes its gradient through
(Megatron's "g").  The per-head norms' weights (Qwen3) see only the rank's heads, so they are declared sharded
over the head dimension of their input and their weight gradient is summed over the group; likewise the rotary
key of DeepSeek's latent attention, computed once and used by every head, gets its gradient summed over the group
(``LayerSplit.shared_columns``).

Which module is which comes from ``transformers_adapter.decoder_layer_split``; a module it does not name stays
whole, which is always correct.  FSDP2 then shards every parameter over the remaining (dp x sp) dimension.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.engine.tp_sequence import apply_tp_sequence_parallel
from hybridflow.engine.transformers_adapter import (
    attention_head_counts,
    decoder_layer_split,
    decoder_stack,
    embedding_and_head,
    moe_experts,
    text_config,
    unwrap_peft,
)

__all__ = ["TensorParallelError", "apply_tensor_parallel", "tensor_parallel_problem"]

# The style of the layers' row-wise projections; None is torch's RowwiseParallel (the tests' sabotage sets it).
# torch.distributed.tensor is imported where a model is split, not with this module: it takes ~0.7 s, which every
# worker process would pay at start-up although most runs have tensor_model_parallel_size=1.
_ROWWISE: type | None = None


class TensorParallelError(ValueError):
    """A model / tp combination that cannot be split (the message says why and what to change)."""


def tensor_parallel_problem(config: Any, tp: int, key: str) -> str | None:
    """Why ``config``'s model cannot be split over ``tp`` ranks (``None`` when it can): query heads, key/value
    heads and the MoE experts' intermediate size must divide; the vocabulary may split unevenly."""
    if tp <= 1:
        return None
    cfg = text_config(config)
    heads, kv = attention_head_counts(config)
    if heads % tp:
        return f"{key}={tp} must divide the {heads} attention heads of the model (each rank computes whole heads)"
    if kv % tp:
        return (f"{key}={tp} must divide the {kv} key/value heads of the model (each rank keeps whole key/value "
                f"heads; replicating them over the group is not built): use a tensor-parallel size dividing {kv}")
    inter = getattr(cfg, "intermediate_size", None)
    if inter and int(inter) % tp:
        return f"{key}={tp} must divide the MLP's intermediate_size {inter}"
    return None


def apply_tensor_parallel(model: nn.Module, tp_mesh, key: str = "megatron.tensor_model_parallel_size",
                          sequence_parallel: bool = False) -> nn.Module:
    """Split ``model`` over ``tp_mesh`` in place (before FSDP2 shards it over the data dimensions); with
    ``sequence_parallel`` each decoder layer also keeps its residual-stream activations split along the tokens
    (``engine/tp_sequence.py``, verl's ``megatron.sequence_parallel``)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    problem = tensor_parallel_problem(model.config, tp_mesh.size(), key)
    if problem:
        raise TensorParallelError(problem)
    _check_lora_targets(model, key)
    # the styles re-register each weight as a new Parameter, which (for the per-head norms) forgets a frozen one
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    for layer in decoder_stack(model).layers:
        split = decoder_layer_split(layer)
        plan: dict[str, Any] = {}
        for name in split.colwise:
            plan.update(_colwise(layer, name))
        for name in split.rowwise:
            plan.update(_rowwise(layer, name))
        # per-head norms see (batch, seq, heads/tp, head_dim): sharded on the head dimension, weight whole
        plan.update({name: SequenceParallel(sequence_dim=2, use_local_output=True) for name in split.head_norms})
        if sequence_parallel:
            plan.update(apply_tp_sequence_parallel(layer, tp_mesh))
        parallelize_module(layer, tp_mesh, plan)
        for name, first in split.shared_columns:
            layer.get_submodule(name).register_forward_hook(_sum_gradient_of_columns(first, tp_mesh.get_group()))
    base = unwrap_peft(model)
    emb_name, head_name, tied = embedding_and_head(model)
    plan = {emb_name: RowwiseParallel(input_layouts=Replicate())}
    if head_name is not None:
        plan[head_name] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(base, tp_mesh, plan)
    if tied:  # parallelize_module gives each module a Parameter of its own: share the one DTensor again
        head = base.get_submodule(head_name)
        head.weight = base.get_submodule(emb_name).weight
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return model


def _is_lora(module: nn.Module) -> bool:
    return hasattr(module, "base_layer") and isinstance(getattr(module, "lora_A", None), nn.ModuleDict)


def _colwise(layer: nn.Module, name: str) -> dict[str, Any]:
    """Plan of a column-wise projection: the weight (and a LoRA adapter's B) split on the output features."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    module = layer.get_submodule(name)
    if not _is_lora(module):
        return {name: ColwiseParallel()}
    return {f"{name}.base_layer": ColwiseParallel(), **{f"{name}.lora_B.{a}": ColwiseParallel() for a in module.lora_B}}


def _rowwise(layer: nn.Module, name: str) -> dict[str, Any]:
    """Plan of a row-wise projection: the weight (and a LoRA adapter's A) split on the input features."""
    from torch.distributed.tensor.parallel import RowwiseParallel

    style = _ROWWISE or RowwiseParallel
    module = layer.get_submodule(name)
    if not _is_lora(module):
        return {name: style()}
    return {f"{name}.base_layer": style(), **{f"{name}.lora_A.{a}": style() for a in module.lora_A}}


def _check_lora_targets(model: nn.Module, key: str) -> None:
    """LoRA adapters tensor parallelism has no split for: on the embedding / LM head (split over the vocabulary) or
    inside a MoE experts module."""
    base = unwrap_peft(model)
    emb, head = base.get_input_embeddings(), base.get_output_embeddings()
    experts = [name for name, _, _ in moe_experts(base)]
    for name, module in base.named_modules():
        if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
            continue
        if any(m is not None and (module is m or module.base_layer is m) for m in (emb, head)):
            raise TensorParallelError(
                f"{key}>1 with a LoRA adapter on {name}: the embedding and the LM head are split over the vocabulary "
                "and their adapters have no split here; leave them out of actor_rollout_ref.model.target_modules "
                "(or add them to exclude_modules)")
        if any(name == e or name.startswith(e + ".") for e in experts):
            raise TensorParallelError(
                f"{key}>1 with a LoRA adapter inside the MoE experts module ({name}): per-expert linear adapters "
                "have no split here (adapters on the stacked expert parameters, peft's ParamWrapper, do); target "
                "the experts' parameters or the attention / shared-expert projections")


class SumGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over ``group`` (Megatron's "f"): a tensor every rank of the group
    holds whole but uses on different data (a slice of the columns, or of the tokens)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def _sum_gradient_of_columns(first: int, group):
    """Forward hook: the module's output columns ``first:`` get their gradient summed over ``group``."""

    def hook(_module, _args, output):
        return torch.cat([output[..., :first], SumGradient.apply(output[..., first:], group)], dim=-1)

    return hook
