"""Megatron's sequence parallelism inside the tensor-parallel group (``<role>.megatron.sequence_parallel``; Korthikanti
et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198).

Tensor parallelism splits attention and the MLP, but every rank of a tp group still holds the whole residual stream
of its rows: the norms' inputs, the residual sums, the decoder layer's input and output -- each (tokens x hidden)
per layer, the same on every rank.  With sequence parallelism each rank keeps only its 1/tp slice of the tokens of
those activations:

    layer input  --scatter-->  own tokens --norm--> --gather--> attention (tp) --reduce, scatter--> own tokens
    + residual (own tokens) --norm--> --gather--> MLP (tp) --reduce, scatter--> own tokens + residual --gather--> out

* **scatter** (Megatron's "scatter to the sequence-parallel region"): forward keeps this rank's slice of the token
  axis (padded to a multiple of tp, so every slice has the same length); backward all-gathers the slices' gradients
  (the ops before it saw every token);
* **gather** ("gather from the sequence-parallel region"): forward all-gathers the slices and drops the padding;
  backward keeps the rank's own slice of the gradient -- the column-wise projections that consume the gathered
  tensor already sum their input gradient over the group (DTensor's ``Replicate`` input), so no further reduction;
* the layer's **norms** run on the slices; their weights are ``Replicate`` DTensors over the tp mesh fed
  ``Shard(1)`` inputs (torch's ``SequenceParallel`` style), so each weight's gradient is summed over the group.

The layer's own input is scattered on entry and its output gathered on exit, so the model code between layers
(embedding, vision merges, pipeline stage boundaries, the final norm and head) sees whole tensors as before: the
saving is every activation a layer keeps for its backward outside attention and the MLP -- the norms' inputs and
the residual stream, tp-fold smaller -- at the cost of one more all-gather per layer than Megatron's (whose residual
stream stays split between layers).  The results equal plain tensor parallelism (``tests/engine/test_tensor_parallel.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["LAYER_NORMS", "apply_tp_sequence_parallel"]

# decoder-layer norms on the residual stream (Llama/Qwen: input / post-attention; Gemma: also pre/post feedforward)
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
_SEQ = 1  # (batch, sequence, hidden)


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, length):
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        size = -(-length // world)
        ctx.group, ctx.length, ctx.size = group, length, size
        pad = size * world - length
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.narrow(_SEQ, rank * size, size).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad.contiguous(), ctx.group).narrow(_SEQ, 0, ctx.length), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, length):
        ctx.group, ctx.size = group, x.shape[_SEQ]
        # contiguous: the projections that read it keep one buffer for their backward (a padded buffer and a
        # reshaped copy of it otherwise)
        return _all_gather(x.contiguous(), group).narrow(_SEQ, 0, length).contiguous()

    @staticmethod
    def backward(ctx, grad):
        world, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        pad = ctx.size * world - grad.shape[_SEQ]
        if pad:
            grad = torch.nn.functional.pad(grad, (0, 0, 0, pad))
        return grad.narrow(_SEQ, rank * ctx.size, ctx.size).contiguous(), None, None


def _all_gather(x: torch.Tensor, group) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=_SEQ)


def _first(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def _replace_first(value: Any, tensor: torch.Tensor) -> Any:
    return (tensor, *value[1:]) if isinstance(value, tuple) else tensor


class _LayerHooks:
    """The scatter / gather points of one decoder layer; ``length`` is the token count of the forward under way."""

    def __init__(self, group):
        self.group = group
        self.length = 0

    def enter(self, _module, args, kwargs):
        if args:
            self.length = int(args[0].shape[_SEQ])
            return (_Scatter.apply(args[0], self.group, self.length), *args[1:]), kwargs
        self.length = int(kwargs["hidden_states"].shape[_SEQ])
        return args, {**kwargs, "hidden_states": _Scatter.apply(kwargs["hidden_states"], self.group, self.length)}

    def leave(self, _module, _args, _kwargs, output):
        return _replace_first(output, _Gather.apply(_first(output), self.group, self.length))

    def gather_input(self, _module, args, kwargs):
        if args:
            return (_Gather.apply(args[0], self.group, self.length), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": _Gather.apply(kwargs["hidden_states"], self.group, self.length)}

    def scatter_output(self, _module, _args, _kwargs, output):
        return _replace_first(output, _Scatter.apply(_first(output), self.group, self.length))


def apply_tp_sequence_parallel(layer: nn.Module, tp_mesh, attention: str = "self_attn", mlp: str = "mlp") -> dict:
    """Hook ``layer`` (already split by tensor parallelism) for sequence parallelism over ``tp_mesh``; returns the
    parallelize plan of its norms (applied by the caller with the rest of the layer's plan)."""
    from torch.distributed.tensor.parallel import SequenceParallel

    hooks = _LayerHooks(tp_mesh.get_group())
    layer.register_forward_pre_hook(hooks.enter, with_kwargs=True)
    layer.register_forward_hook(hooks.leave, with_kwargs=True)
    for name in (attention, mlp):
        block = getattr(layer, name)
        block.register_forward_pre_hook(hooks.gather_input, with_kwargs=True)
        block.register_forward_hook(hooks.scatter_output, with_kwargs=True)
    return {name: SequenceParallel(sequence_dim=_SEQ, use_local_output=True)
            for name in LAYER_NORMS if isinstance(getattr(layer, name, None), nn.Module)}
