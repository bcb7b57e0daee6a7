"""Ulysses sequence parallelism: the collectives and the attention that swaps sequence shards for head shards.

DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509) splits a packed sequence of N tokens over the ``sp``
ranks of a group: every layer except attention is token-wise, so each rank runs it on its N/sp tokens.
Attention needs every token, so around it one all-to-all turns the (N/sp tokens, all heads) shards into
(all N tokens, heads/sp) shards, each rank attends over the whole sequence for its heads, and a second
all-to-all turns the output back into token shards.  Per layer and rank that moves 4 tensors of
N/sp x hidden x (sp-1)/sp elements forward (q, k, v, output) and as many backward, independent of the number
of layers' parameters -- what lets the sequence grow with the group.

This module holds:

* :func:`all_to_all` / :func:`gather_sequence` -- differentiable collectives over the sp group (gloo on CPU,
  NCCL on GPU: ``torch.distributed`` picks the backend of the group's device);
* :class:`UlyssesBatch` -- the packed micro-batch's sequence boundaries, handed to every attention call;
* :func:`make_ulysses_attention` -- wraps one of transformers' attention functions (registered through
  ``engine/transformers_adapter.py``): with a ``UlyssesBatch`` among its keyword arguments it does the all-to-all
  dance, otherwise it is the original function (rollout, other roles, models without SP);
* :func:`check_attention_heads` -- the head counts sp must divide;
* :data:`COMM` -- bytes each rank sent, per collective (the benchmark's communication volume).

GQA with fewer key/value heads than ``sp`` (e.g. 2 KV heads, sp = 4): each KV head is repeated sp / n_kv times
before the all-to-all so every rank receives exactly one, the one its query heads use (query heads are split in
contiguous blocks of H/sp and KV head j serves query heads [j H/n_kv, (j+1) H/n_kv)).  This is what verl does;
it costs sp / n_kv times the K/V traffic of a model with enough KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hybridflow.utils.sequence_parallel_rules import ulysses_head_error

__all__ = [
    "ULYSSES_KWARG", "UlyssesBatch", "CommCounter", "COMM", "all_to_all", "gather_sequence",
    "make_ulysses_attention", "check_attention_heads", "UlyssesConfigError",
]

# The keyword under which the decoder hands the batch to every attention call (see ulysses_forward.py).
ULYSSES_KWARG = "hybridflow_ulysses"


class UlyssesConfigError(ValueError):
    """A model / sp combination Ulysses cannot run (the message says why and what to change)."""


@dataclass
class CommCounter:
    """Bytes this rank sent to its sp peers, per collective (``reset()`` between measurements)."""

    sent: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: float) -> None:
        self.sent[kind] = self.sent.get(kind, 0.0) + float(nbytes)
        self.calls[kind] = self.calls.get(kind, 0) + 1

    def reset(self) -> None:
        self.sent.clear()
        self.calls.clear()

    def total(self) -> float:
        return sum(self.sent.values())


COMM = CommCounter()


# ---------------------------------------------------------------------------------------------- collectives
def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    sp = dist.get_world_size(group)
    if x.shape[scatter_dim] % sp:
        raise UlyssesConfigError(f"all-to-all: dimension {scatter_dim} of {tuple(x.shape)} does not split into {sp}")
    send = torch.stack(x.chunk(sp, dim=scatter_dim)).contiguous()  # chunk i goes to rank i
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    COMM.add("all_to_all", send.numel() * send.element_size() * (sp - 1) / sp)
    return torch.cat(list(recv.unbind(0)), dim=gather_dim)  # chunk j came from rank j


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        # The inverse exchange: what rank i received from j goes back to j, in the slot it came from.
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Split ``x`` along ``scatter_dim`` into sp chunks, send chunk i to rank i, concatenate what arrives along
    ``gather_dim`` in rank order.  Differentiable (the backward is the inverse exchange)."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group, grad_scale):
        sp, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.dim, ctx.rank, ctx.sp, ctx.grad_scale = dim, rank, sp, grad_scale
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(sp)]
        dist.all_gather(parts, x, group=group)
        COMM.add("all_gather", x.numel() * x.element_size() * (sp - 1))
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        mine = grad.chunk(ctx.sp, dim=ctx.dim)[ctx.rank]
        return (mine * ctx.grad_scale).contiguous(), None, None, None


def gather_sequence(x: torch.Tensor, dim: int, group, grad_scale: float = 1.0) -> torch.Tensor:
    """All-gather the sp ranks' equal-size slices of ``x`` along ``dim`` (rank order).

    Backward hands each rank the gradient of its own slice times ``grad_scale``.  The engine passes
    ``grad_scale = sp``: every sp peer computes the same loss from the gathered outputs, and FSDP averages
    gradients over all dp x sp ranks, so without the factor the sum over a group's token slices would come out
    divided by sp (see ``engine/ulysses_forward.py``).
    """
    return _GatherSequence.apply(x, dim, group, float(grad_scale))


# ---------------------------------------------------------------------------------------------- attention
@dataclass(frozen=True)
class UlyssesBatch:
    """One packed micro-batch as the attention of every sp rank sees it.

    ``segments``: (start, end) of each sequence in the padded packed row of ``total`` tokens (the last one may
    be the padding that makes ``total`` divisible by sp); ``cu_seqlens`` the same as an int32 tensor on the
    device (flash-attention's varlen form); ``max_len`` the longest segment.
    """

    group: Any
    sp: int
    segments: tuple[tuple[int, int], ...]
    cu_seqlens: torch.Tensor
    max_len: int
    total: int

    @property
    def local_len(self) -> int:
        return self.total // self.sp


def check_attention_heads(num_heads: int, num_kv_heads: int, sp: int, key: str) -> None:
    """Refuse, with the reason, a head layout the all-to-all cannot split (the rule the config checks too)."""
    problem = ulysses_head_error(num_heads, num_kv_heads, sp, key)
    if problem:
        raise UlyssesConfigError(problem)


def _repeat_kv_heads(x: torch.Tensor, times: int) -> torch.Tensor:
    """(B, Hkv, S, D) -> (B, Hkv * times, S, D), each head repeated ``times`` times in place."""
    if times == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, times, s, d).reshape(b, h * times, s, d)


def _sliding_mask(length: int, window: int, device) -> torch.Tensor:
    """Causal mask that also hides keys more than ``window`` - 1 positions back (transformers' convention)."""
    i = torch.arange(length, device=device)
    diff = i[:, None] - i[None, :]
    return (diff >= 0) & (diff < window)


def _segment_sdpa(q, k, v, batch: UlyssesBatch, dropout: float, scaling, sliding_window,
                  softcap: float | None = None) -> torch.Tensor:
    """Causal SDPA over each packed sequence separately: O(sum L_i^2), never an N x N mask.

    q: (1, Hq, N, D), k/v: (1, Hkv, N, D) with Hq a multiple of Hkv -> (1, N, Hq, D).  ``softcap`` (Gemma-2's
    attention logit soft-capping, which torch's SDPA cannot apply): each segment's scores are computed, capped
    (``cap * tanh(s / cap)``), masked and normalised as transformers' eager attention does.
    """
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for start, end in batch.segments:
        qs, ks, vs = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        length = end - start
        mask = None
        if sliding_window is not None and length > int(sliding_window):
            mask = _sliding_mask(length, int(sliding_window), q.device)
        if softcap is not None:
            outs.append(_capped_attention(qs, ks, vs, mask, dropout, scaling, float(softcap)))
            continue
        outs.append(F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, dropout_p=dropout, is_causal=mask is None and length > 1, scale=scaling,
            enable_gqa=gqa))
    return torch.cat(outs, dim=2).transpose(1, 2)


def _capped_attention(q, k, v, mask, dropout: float, scaling, softcap: float) -> torch.Tensor:
    """One sequence's causal attention with soft-capped scores: (1, Hq, L, D) -> (1, Hq, L, D)."""
    repeat = q.shape[1] // k.shape[1]
    k, v = _repeat_kv_heads(k, repeat), _repeat_kv_heads(v, repeat)
    scale = float(scaling) if scaling is not None else q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    length = q.shape[2]
    allowed = mask if mask is not None else torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if dropout:
        probs = F.dropout(probs, p=dropout, training=True)
    return torch.matmul(probs, v)


_UNSUPPORTED_SDPA = ("s_aux", "position_bias")  # attention sinks, relative position biases


def _ulysses_attention(original: Callable, varlen: bool, batch: UlyssesBatch, module, query, key, value,
                       dropout: float = 0.0, scaling=None, sliding_window=None, **kwargs):
    group, sp = batch.group, batch.sp
    if query.shape[0] != 1 or query.shape[2] != batch.local_len:
        raise UlyssesConfigError(
            f"Ulysses attention expects one packed row of {batch.local_len} tokens per rank, got query "
            f"{tuple(query.shape)}: the model's decoder did not receive the sliced sequence")
    n_kv = key.shape[1]
    if n_kv < sp:
        key, value = _repeat_kv_heads(key, sp // n_kv), _repeat_kv_heads(value, sp // n_kv)
    # (1, H, N/sp, D) -> (1, H/sp, N, D): gather the sequence, scatter the heads
    query, key, value = (all_to_all(t, 1, 2, group) for t in (query, key, value))
    kwargs.pop("position_ids", None)  # local positions; the boundaries come from the batch
    if varlen:
        cu = batch.cu_seqlens
        out, _ = original(module, query, key, value, None, dropout=dropout, scaling=scaling,
                          sliding_window=sliding_window, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                          max_length_q=batch.max_len, max_length_k=batch.max_len, **kwargs)
    else:
        for name in _UNSUPPORTED_SDPA:
            if kwargs.get(name) is not None:
                raise UlyssesConfigError(f"Ulysses sequence parallelism with sdpa attention cannot apply '{name}' "
                                         "(this model needs it); run it with flash attention on a GPU")
        out = _segment_sdpa(query, key, value, batch, dropout, scaling, sliding_window, kwargs.get("softcap"))
    # (1, N, H/sp, D) -> (1, N/sp, H, D): scatter the sequence back, gather the heads
    return all_to_all(out, 1, 2, group), None


def make_ulysses_attention(original: Callable, varlen: bool) -> Callable:
    """An attention function with transformers' signature that is ``original`` unless the call carries a
    :class:`UlyssesBatch` (keyword :data:`ULYSSES_KWARG`).  ``varlen``: ``original`` is a flash-attention
    function taking ``cu_seq_lens_*`` / ``max_length_*`` (the whole packed sequence is attended in one call);
    otherwise each sequence is attended by torch's SDPA on its own."""

    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        batch = kwargs.pop(ULYSSES_KWARG, None)
        if batch is None:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        if args:
            raise UlyssesConfigError(f"{type(module).__name__} passes {len(args)} positional arguments to its "
                                     "attention function; Ulysses expects transformers' keyword convention")
        return _ulysses_attention(original, varlen, batch, module, query, key, value, **kwargs)

    attention.__wrapped__ = original
    return attention

