"""The per-token passes of ``engine/forward.py`` through pipeline stages: log-probs / entropy and values.

Without pipeline parallelism a worker runs its micro-batches one after another through the whole model. With it,
the micro-batches of a pass (a mini-batch's update, an old-log-prob or reference pass, the critic's values) go
through the stages together (``PipelineRunner``), so the stages work on different micro-batches at once. Each
micro-batch is laid out as the unpipelined pass lays it out -- the trimmed layout (the columns padding in every
row cut off) or, with ``use_remove_padding``, packed rows with attention padded inside -- and the last stage runs
the same head (``forward._lm_head``, ``forward._token_value_head``) on it, so the outputs are the unpipelined
pass's. A head's outputs come back as a (rows, kinds, R) tensor per micro-batch: the response tokens' values of
each output kind (``log_probs``, ``entropy``, ``values``...).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from hybridflow.engine.padded_attention import padded_attention
from hybridflow.engine.parallel.pipeline import MicroBatchInputs, PassOptions, PipelineError, PipelineRunner
from hybridflow.engine.ulysses_forward import SequenceParallel, UlyssesPlan, ulysses_pass

__all__ = ["PipelinePass", "pipeline_outputs", "pipeline_train"]


@dataclass
class _Layout:
    """Where a micro-batch's compact model inputs come from and where their outputs go back."""

    inputs: MicroBatchInputs
    keep: int | None  # the last ``keep`` positions are wanted (None: all)
    start: int  # the first wanted column of the (B, L) batch
    hi: int  # one past the last valid column
    shape: tuple[int, int]  # (B, L)
    packed_mask: torch.Tensor | None = None  # packed layout: the (B, L) mask of the packed row's tokens
    plan: UlyssesPlan | None = None  # sequence parallelism: the packed row's split over the group


@dataclass
class PipelinePass:
    """One pass's head: ``head_fn`` (a ``forward`` head), the output kinds it returns, the response length."""

    head_fn: Callable
    kinds: tuple[str, ...]
    response_length: int
    packed: bool = False
    sequence_parallel: SequenceParallel | None = None  # sp > 1: every stage works on this rank's slice of the row
    # a vision-language model: each micro-batch's merged pixel inputs (``vision.merge_multi_modal_inputs``), which
    # the first stage's backbone takes with the token ids
    multi_modal: list[dict[str, torch.Tensor]] | None = None

    def shape(self, rows: int, length: int) -> tuple[int, ...]:
        return (rows, len(self.kinds), self.response_length)


def _trimmed(batch: dict[str, torch.Tensor], first_col: int) -> _Layout:
    mask = batch["attention_mask"].bool()
    B, L = mask.shape
    cols = mask.any(dim=0).nonzero().flatten()
    lo, hi = (int(cols[0]), int(cols[-1]) + 1) if cols.numel() else (0, L)
    start = min(max(first_col, lo), hi - 1)
    keep = None if start == lo else hi - start
    pos = batch["position_ids"][..., lo:hi]  # (B, L) or (B, 4, L): the stages give the model model_position_ids
    inputs = MicroBatchInputs(batch["input_ids"][:, lo:hi], batch["attention_mask"][:, lo:hi], pos)
    return _Layout(inputs, keep, start, hi, (B, L))


def _packed(batch: dict[str, torch.Tensor], first_col: int) -> _Layout:
    """All valid tokens of the micro-batch in one row (positions restarting per sequence); the stages attend within
    each sequence through ``padded_attention`` over the micro-batch's mask."""
    mask = batch["attention_mask"].bool()
    B, L = mask.shape
    ids = batch["input_ids"][mask].unsqueeze(0)
    position_ids = batch["position_ids"]
    pos = (position_ids[mask] if position_ids.dim() == 2 else position_ids.transpose(0, 1)[:, mask]).unsqueeze(0)
    layout = _Layout(MicroBatchInputs(ids, torch.ones_like(ids), pos), None, first_col, L, (B, L),
                     packed_mask=batch["attention_mask"])
    return layout


def _ulysses(batch: dict[str, torch.Tensor], first_col: int, sp: SequenceParallel) -> _Layout:
    """The sequence-parallel layout: the micro-batch's tokens packed into one row padded to a multiple of sp
    (``UlyssesPlan``, as without a pipeline); the stages run this rank's slice of it."""
    mask = batch["attention_mask"]
    plan = UlyssesPlan.build(batch["input_ids"], mask, batch["position_ids"], first_col, sp)
    pos = plan.position_ids if plan.position_ids.dim() == 2 else plan.position_ids.transpose(0, 1)  # (1, 4, N)
    inputs = MicroBatchInputs(plan.ids, torch.ones_like(plan.ids), pos)
    return _Layout(inputs, None, first_col, mask.shape[1], tuple(mask.shape), packed_mask=mask, plan=plan)


def _sp_outputs(spec: PipelinePass, lay: _Layout, model, position_ids) -> dict[str, torch.Tensor]:
    """The head on this rank's slice, its outputs gathered over the group into the (B, L) layout."""
    plan, sp = lay.plan, spec.sequence_parallel
    labels = plan.labels if plan.keep is None else plan.labels[plan.keep]
    outs = spec.head_fn(model, plan.ids, None, position_ids, plan.keep, labels.unsqueeze(0))
    mask = lay.packed_mask.bool()
    full = {}
    for key, value in outs.items():
        gathered = plan.gather(value, sp)
        full[key] = gathered.new_zeros(mask.shape + tuple(gathered.shape[1:]))
        full[key][mask] = gathered
    return full


def _head(spec: PipelinePass, layouts: list[_Layout]):
    """The last stage's computation: the head on a micro-batch, its outputs at the response tokens."""

    class Head:
        def shape(self, rows: int, length: int) -> tuple[int, ...]:
            if spec.packed or spec.sequence_parallel is not None:  # one packed row in, the (B, R) outputs out
                return spec.shape(max(lay.shape[0] for lay in layouts), 0)
            return spec.shape(rows, length)

        def __call__(self, model, ids, attention_mask, position_ids, i):
            lay = layouts[i]
            R = spec.response_length
            B, L = lay.shape
            if lay.plan is not None:  # (inside the stage's sequence-parallel context: _context)
                full = _sp_outputs(spec, lay, model, position_ids)
            elif spec.packed:  # (inside the stage's padded_attention context: _context)
                mask = lay.packed_mask.bool()
                outs = spec.head_fn(model, ids, None, position_ids, None, torch.roll(ids, shifts=-1, dims=1))
                full = {k: v.new_zeros((B, L) + tuple(v.shape[2:])) for k, v in outs.items()}
                for k, v in outs.items():
                    full[k][mask] = v[0]
            else:
                labels = torch.roll(ids, shifts=-1, dims=1)
                if lay.keep is not None:
                    labels = labels[:, -lay.keep:]
                outs = spec.head_fn(model, ids, attention_mask, position_ids, lay.keep, labels)
                full = {k: v.new_zeros((B, L) + tuple(v.shape[2:])) for k, v in outs.items()}
                for k, v in outs.items():
                    full[k][:, lay.start: lay.hi] = v
            return torch.stack([full[k][:, -R - 1: -1].float() for k in spec.kinds], dim=1)

    return Head()


def _layouts(batches: list[dict[str, torch.Tensor]], spec: PipelinePass) -> list[_Layout]:
    first_cols = [b["input_ids"].shape[-1] - spec.response_length - 1 for b in batches]
    if spec.sequence_parallel is not None:
        return [_ulysses(b, c, spec.sequence_parallel) for b, c in zip(batches, first_cols)]
    make = _packed if spec.packed else _trimmed
    return [make(b, c) for b, c in zip(batches, first_cols)]


def _run_options(spec: PipelinePass, layouts: list[_Layout]) -> PassOptions:
    """The runner's layout of a pass: the context, packed rows, under sequence parallelism this rank's slice of
    each row and the group's size, and a vision-language model's pixel inputs for the first stage."""
    options = PassOptions(context=_context(layouts), packed=spec.packed or spec.sequence_parallel is not None)
    sp = spec.sequence_parallel
    if sp is not None:
        if spec.multi_modal is not None:
            raise PipelineError("a vision-language model with pipeline stages and sequence parallelism together is "
                                "not built: set context_parallel_size (ulysses_sequence_parallel_size) to 1 or the "
                                "pipeline size to 1")
        options.seq_slices = [slice(sp.rank * lay.plan.batch.local_len, (sp.rank + 1) * lay.plan.batch.local_len)
                              for lay in layouts]
        options.sp = sp.size
    if spec.multi_modal is not None:
        inputs = spec.multi_modal
        options.first_inputs = lambda i: inputs[i]
    return options


def pipeline_outputs(runner: PipelineRunner, batches: list[dict[str, torch.Tensor]],
                     spec: PipelinePass) -> list[dict[str, torch.Tensor]]:
    """Forward-only: each micro-batch's ``{kind: (B, R)}`` outputs -- real on the rank holding the last stage, zeros
    of the same shape elsewhere (the controller collects the last stage's)."""
    layouts = _layouts(batches, spec)
    outs = runner.forward([lay.inputs for lay in layouts], _head(spec, layouts), _run_options(spec, layouts))
    result = []
    for i, b in enumerate(batches):
        rows = b["input_ids"].shape[0]
        out = outs[i][:rows] if outs is not None else torch.zeros(rows, len(spec.kinds), spec.response_length)
        result.append({k: out[:, j] for j, k in enumerate(spec.kinds)})
    return result


def pipeline_train(runner: PipelineRunner, batches: list[dict[str, torch.Tensor]], spec: PipelinePass,
                   loss: Callable[[dict[str, torch.Tensor], int], torch.Tensor]) -> None:
    """Forward and backward of every micro-batch; ``loss(outputs, i)`` (on the last stage) is micro-batch ``i``'s
    loss from its ``{kind: (B, R)}`` outputs."""
    layouts = _layouts(batches, spec)

    def micro_loss(out: torch.Tensor, i: int) -> torch.Tensor:
        rows = batches[i]["input_ids"].shape[0]
        return loss({k: out[:rows, j] for j, k in enumerate(spec.kinds)}, i)

    runner.train([lay.inputs for lay in layouts], _head(spec, layouts), micro_loss, _run_options(spec, layouts))


def _context(layouts: list[_Layout]) -> Callable[[int], contextlib.AbstractContextManager]:
    """Packed rows: each stage's attention kept within the micro-batch's sequences (``padded_attention``); under
    sequence parallelism the Ulysses attention's context (its all-to-alls over the group, the row's segments)."""
    def context(i: int):
        if layouts[i].plan is not None:
            return ulysses_pass(layouts[i].plan.batch)
        mask = layouts[i].packed_mask
        return padded_attention(mask.bool()) if mask is not None else contextlib.nullcontext({})

    return context
