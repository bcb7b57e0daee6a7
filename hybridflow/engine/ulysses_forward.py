"""The sequence-parallel forward of one micro-batch: pack, pad, split the token axis, run, gather per sample.

Every rank of an sp group holds the same micro-batch (the controller's dispatch replicates it across the group).
For that micro-batch each rank:

1. packs the valid tokens of all rows into one row of N tokens (padding-free, as ``use_remove_padding`` does),
   pads it with a dummy sequence to N' = a multiple of sp, and computes every token's label (the next token) on
   the whole row -- so a sequence that crosses a shard boundary keeps the right label at the boundary;
2. calls the model on the whole row; a forward pre-hook on the decoder stack (``transformers_adapter.
   decoder_stack``) cuts ``input_ids`` -- or, for a VLM, the ``inputs_embeds`` that already hold the image
   features -- and ``position_ids`` (all four M-RoPE rows of a Qwen2-VL alike) to this rank's N'/sp slice, and
   adds the :class:`~hybridflow.engine.ulysses.UlyssesBatch` to the keyword arguments the decoder passes to every
   attention call (they survive gradient checkpointing's recomputation, which re-runs a layer with its
   original keyword arguments);
3. attention is transformers' own function wrapped by ``engine/ulysses.make_ulysses_attention`` (all-to-all to
   head shards, attention over the whole row, all-to-all back); while the forward runs, the mask builders of
   the wrapped implementations return no mask, so no N'/sp x N'/sp mask is materialised for nothing;
4. the head (log-probs / entropy / values / scores) runs on the rank's own tokens only, at the positions wanted
   (``first_col``); the results are all-gathered over the group, the padding dropped, and scattered back to
   the (B, L) layout -- identical on every rank of the group.

Gradients: each rank computes the same loss from the gathered outputs; the gather's backward gives each rank the
gradient of its own slice, so the parameter gradients of the sp ranks add up to the gradient of that loss.  FSDP
averages gradients over all dp x sp ranks, while the loss normalisers count dp groups
(``TrainEngine.dp_size``), so the gather scales the slice's gradient by sp to make that average a sum over the
group (``gather_sequence(grad_scale=sp)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from hybridflow.engine.transformers_adapter import (
    EAGER_PREFIX,
    attention_head_counts,
    attention_implementation,
    decoder_stack,
    no_mask_while,
    register_eager_attention,
    use_attention_implementation,
    wrap_attention_function,
    wrap_mask_function,
)
from hybridflow.engine.ulysses import (
    ULYSSES_KWARG,
    UlyssesBatch,
    UlyssesConfigError,
    check_attention_heads,
    gather_sequence,
    make_ulysses_attention,
)

__all__ = ["SequenceParallel", "UlyssesPlan", "install_ulysses_attention", "sequence_parallel_outputs", "ulysses_pass"]

_VARLEN = ("flash_attention_2", "flash_attention_3")
_SUPPORTED = ("sdpa",) + _VARLEN
_TAG = "hybridflow-ulysses"
_FORWARD_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("hybridflow_ulysses_forward", default=False)


def install_ulysses_attention(names: tuple[str, ...] = _SUPPORTED) -> None:
    """Wrap transformers' sdpa and flash-attention functions (and their mask builders) once per process.

    The wrappers act only on calls that carry a ``UlyssesBatch``; every other model and call is unchanged.
    """
    for name in names:
        varlen = name in _VARLEN
        if wrap_attention_function(name, lambda orig, v=varlen: make_ulysses_attention(orig, v), _TAG):
            wrap_mask_function(name, no_mask_while(_FORWARD_ACTIVE), _TAG)


def _ulysses_eager(module: nn.Module) -> str:
    """A model that runs eager attention (no sdpa path: Gemma-2's soft-capped attention) keeps its own eager function
    for every call, under a registered name the Ulysses wrapper is installed over; its split calls are attended
    per packed sequence by ``engine/ulysses.py`` (soft-capping included)."""
    name = register_eager_attention(module)
    install_ulysses_attention((name,))
    use_attention_implementation(module, name)
    return name


@dataclass
class SequenceParallel:
    """One engine's sp group: ``size`` ranks, this rank's index ``rank`` in it and the process ``group``."""

    group: Any
    size: int
    rank: int

    @classmethod
    def for_module(cls, module: nn.Module, group, size: int, rank: int, key: str, tp: int = 1) -> "SequenceParallel":
        """Check that ``module`` can be split (attention implementation, head counts) and install the attention.

        With tensor parallelism (``tp`` > 1) each rank's attention holds heads/tp query and key/value heads, and the
        sequence-parallel all-to-all splits those."""
        config = module.config
        impl = attention_implementation(config)
        if impl == "eager" or impl.startswith(EAGER_PREFIX):
            impl = _ulysses_eager(module)
        elif impl not in _SUPPORTED:
            raise UlyssesConfigError(
                f"{key}={size}: the model runs attention implementation '{impl}'; Ulysses sequence parallelism "
                f"works with {', '.join(_SUPPORTED)} and eager (hybridflow loads sdpa on CPU, flash_attention_2 on GPU)")
        heads, kv_heads = attention_head_counts(config)
        check_attention_heads(heads // max(int(tp), 1), max(kv_heads // max(int(tp), 1), 1), size, key)
        decoder_stack(module)  # raises now, not in the first forward, if the model has none
        if impl in _SUPPORTED:
            install_ulysses_attention()
        return cls(group=group, size=int(size), rank=int(rank))


@dataclass
class UlyssesPlan:
    """Where a (B, L) micro-batch's tokens go in the padded packed row and in this rank's slice."""

    ids: torch.Tensor  # (1, N') packed input ids (padding id 0 at the end)
    position_ids: torch.Tensor  # (1, N') or (4, 1, N') for M-RoPE
    labels: torch.Tensor  # (N'/sp,) next-token ids of this rank's slice
    keep: torch.Tensor | None  # indices in the slice whose outputs are wanted (None: all)
    n_valid: int  # N
    batch: UlyssesBatch
    # No wanted position in this slice (e.g. all prompt): the head still runs on one position, whose output is
    # multiplied by 0, so the rank's loss stays connected to its layers and its backward joins the group's
    # all-to-alls (a disconnected rank would leave its peers waiting in the collective).
    placeholder: bool = False

    @classmethod
    def build(cls, input_ids, attention_mask, position_ids, first_col: int, sp: SequenceParallel) -> "UlyssesPlan":
        mask = attention_mask.bool()
        B, L = mask.shape
        lengths = mask.sum(-1).tolist()
        n = int(sum(lengths))
        pad = (-n) % sp.size
        total = n + pad
        device = input_ids.device
        ids = torch.cat([input_ids[mask], input_ids.new_zeros(pad)])
        filler = torch.arange(pad, device=device, dtype=position_ids.dtype)  # the padding: a sequence of its own
        if position_ids.dim() == 3:  # (B, 4, L): text row + M-RoPE rows, split alike
            rows = position_ids.transpose(0, 1)[:, mask]
            pos = torch.cat([rows, filler.expand(rows.shape[0], pad)], dim=1).unsqueeze(1)
        else:
            pos = torch.cat([position_ids[mask], filler]).unsqueeze(0)
        seg_lengths = [int(x) for x in lengths if x > 0] + ([pad] if pad else [])
        bounds, start = [], 0
        for length in seg_lengths:
            bounds.append((start, start + length))
            start += length
        cu = torch.tensor([0] + [e for _, e in bounds], dtype=torch.int32, device=device)
        local = total // sp.size
        lo, hi = sp.rank * local, (sp.rank + 1) * local
        wanted = torch.zeros(total, dtype=torch.bool, device=device)
        cols = torch.arange(L, device=device).expand(B, L)
        wanted[:n] = (cols >= first_col)[mask]
        mine = wanted[lo:hi]
        keep = None if bool(mine.all()) else mine.nonzero().flatten()
        placeholder = keep is not None and keep.numel() == 0
        if placeholder:
            keep = torch.zeros(1, dtype=torch.long, device=device)
        labels = torch.roll(ids, shifts=-1)[lo:hi]  # the last label of a sequence is never read
        batch = UlyssesBatch(group=sp.group, sp=sp.size, segments=tuple(bounds), cu_seqlens=cu,
                             max_len=max(seg_lengths), total=total)
        return cls(ids.unsqueeze(0), pos, labels, keep, n, batch, placeholder)

    def gather(self, local_out: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
        """(1, k) outputs at ``keep`` -> (N,) outputs of every packed token (0 where not wanted), all ranks."""
        values = local_out[0] * 0 if self.placeholder else local_out[0]
        if self.keep is not None:
            full_local = values.new_zeros((self.batch.local_len,) + tuple(values.shape[1:]))
            values = full_local.index_put((self.keep,), values)
        gathered = gather_sequence(values, 0, sp.group, grad_scale=sp.size)
        return gathered[: self.n_valid]


@contextlib.contextmanager
def _split_decoder_inputs(module: nn.Module, batch: UlyssesBatch, rank: int) -> Iterator[None]:
    """Install the pre-hook that cuts the decoder's inputs to this rank's slice (see the module docstring)."""
    decoder = decoder_stack(module)
    lo, hi = rank * batch.local_len, (rank + 1) * batch.local_len

    def cut(_module, args, kwargs):
        if args:  # e.g. token-classification heads pass input_ids positionally: name them
            bound = inspect.signature(_module.forward).bind_partial(*args)
            kwargs = {**bound.arguments, **kwargs}
        for name in ("input_ids", "inputs_embeds"):
            x = kwargs.get(name)
            if x is not None:
                if x.shape[1] != batch.total:
                    raise UlyssesConfigError(f"the decoder received {name} of {x.shape[1]} tokens, the packed row has "
                                             f"{batch.total}: the model changed the sequence before its decoder")
                kwargs[name] = x[:, lo:hi].contiguous()
        pos = kwargs.get("position_ids")
        if pos is not None:
            kwargs["position_ids"] = pos[..., lo:hi].contiguous()
        kwargs[ULYSSES_KWARG] = batch
        return (), kwargs

    handle = decoder.register_forward_pre_hook(cut, with_kwargs=True)
    token = _FORWARD_ACTIVE.set(True)
    try:
        yield
    finally:
        _FORWARD_ACTIVE.reset(token)
        handle.remove()


@contextlib.contextmanager
def ulysses_pass(batch: UlyssesBatch) -> Iterator[dict[str, Any]]:
    """A pipeline stage's call on its slice of a packed row (already cut): the Ulysses attention on and the
    keyword argument that carries the row's layout to it (what :func:`_split_decoder_inputs` adds by hook)."""
    token = _FORWARD_ACTIVE.set(True)
    try:
        yield {ULYSSES_KWARG: batch}
    finally:
        _FORWARD_ACTIVE.reset(token)


def sequence_parallel_outputs(module: nn.Module, input_ids, attention_mask, position_ids, head_fn, first_col: int,
                              multi_modal: dict[str, Any], sp: SequenceParallel) -> dict[str, torch.Tensor]:
    """``per_position_outputs`` under sequence parallelism: (B, L) outputs, equal on every rank of the group."""
    plan = UlyssesPlan.build(input_ids, attention_mask, position_ids, first_col, sp)
    labels = plan.labels if plan.keep is None else plan.labels[plan.keep]
    with _split_decoder_inputs(module, plan.batch, sp.rank):
        outs = head_fn(module, plan.ids, None, plan.position_ids, plan.keep, labels.unsqueeze(0), **multi_modal)
    mask = attention_mask.bool()
    full = {}
    for key, value in outs.items():
        gathered = plan.gather(value, sp)
        buf = gathered.new_zeros(mask.shape + tuple(gathered.shape[1:]))
        buf[mask] = gathered
        full[key] = buf
    return full
