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
* everything else (norms, the critic's score head) is whole on every rank and computes the same thing there.

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
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from hybridflow.engine.transformers_adapter import (
    attention_head_counts,
    decoder_layer_split,
    decoder_stack,
    embedding_and_head,
    text_config,
)

__all__ = ["TensorParallelError", "apply_tensor_parallel", "tensor_parallel_problem"]

_ROWWISE = RowwiseParallel  # the style of the layers' row-wise projections (the tests' sabotage swaps it)


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


def apply_tensor_parallel(model: nn.Module, tp_mesh, key: str = "megatron.tensor_model_parallel_size") -> nn.Module:
    """Split ``model`` over ``tp_mesh`` in place (before FSDP2 shards it over the data dimensions)."""
    from torch.distributed.tensor import Replicate, Shard


    if hasattr(model, "peft_config"):
        raise TensorParallelError(f"{key}>1 with LoRA adapters is not supported (the adapters' low-rank layers would "
                                  "need a split of their own); train LoRA with tensor_model_parallel_size=1")
    problem = tensor_parallel_problem(model.config, tp_mesh.size(), key)
    if problem:
        raise TensorParallelError(problem)
    for layer in decoder_stack(model).layers:
        split = decoder_layer_split(layer)
        plan: dict[str, Any] = {name: ColwiseParallel() for name in split.colwise}
        plan.update({name: _ROWWISE() for name in split.rowwise})
        # per-head norms see (batch, seq, heads/tp, head_dim): sharded on the head dimension, weight whole
        plan.update({name: SequenceParallel(sequence_dim=2, use_local_output=True) for name in split.head_norms})
        parallelize_module(layer, tp_mesh, plan)
        for name, first in split.shared_columns:
            layer.get_submodule(name).register_forward_hook(_sum_gradient_of_columns(first, tp_mesh.get_group()))
    emb_name, head_name, tied = embedding_and_head(model)
    plan = {emb_name: RowwiseParallel(input_layouts=Replicate())}
    if head_name is not None:
        plan[head_name] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(model, tp_mesh, plan)
    if tied:  # parallelize_module gives each module a Parameter of its own: share the one DTensor again
        head = model.get_submodule(head_name)
        head.weight = model.get_submodule(emb_name).weight
    return model


class _SumGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the tensor-parallel group (Megatron's "f")."""

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
        return torch.cat([output[..., :first], _SumGradient.apply(output[..., first:], group)], dim=-1)

    return hook
