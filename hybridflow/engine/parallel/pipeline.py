"""Pipeline parallelism: the decoder split into stages by layers, run by ``torch.distributed.pipelining``'s schedules.

A model's ``num_hidden_layers`` decoder layers are cut into ``pp x vpp`` consecutive stages (``vpp`` virtual stages
per rank: verl's ``virtual_pipeline_model_parallel_size``); stage ``s`` lives on pipeline rank ``s % pp`` (the
interleaved assignment of Narayanan et al. 2021, which torch's interleaved schedule expects). The first stage also
holds the input embedding, the last the final norm and the head (the LM head, a critic's value head). verl's
``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage`` fix the two ends; the other layers
are split evenly.

A stage is a *view* of the model (:class:`StageModel`): the containers are copied, the modules are shared, and the
layers of other stages are :class:`SkippedLayer` placeholders that pass the hidden states through. Parameter names
are therefore the model's own (``model.layers.7.mlp...``) on whichever rank holds them, so checkpoints, weight sync
and merges need no renaming, and the stage runs the model family's own forward (``inputs_embeds`` after the first
stage), which keeps it exactly the unsharded computation.

Between stages travel the hidden states and four small integer tensors (the attention mask, the position ids,
the token ids -- the last stage reads its labels from them -- and the micro-batch's index); the last stage runs
the *head* the caller gives for the pass (per-token log-probs and entropy, values) and, when training, the loss of
each micro-batch. :class:`PipelineRunner` pads a pass's micro-batches to one shape (right-padding columns and
empty rows: invisible to the causal rows; the head sees each micro-batch cut back to its own shape), declares that
shape to the stages (static metadata: no probing forward), and runs GPipe, 1F1B or interleaved 1F1B. Gradients
are not rescaled by the schedule (``scale_grads=False``): the losses are already normalised over the whole
mini-batch, as without pipelining.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.data.mrope import model_position_ids
from hybridflow.engine.transformers_adapter import decoder_stack, embedding_and_head, unwrap_peft
from hybridflow.engine.vision import vision_in_every_step, vision_tower

__all__ = ["MicroBatchInputs", "PassOptions", "PipelineError", "PipelineHead", "PipelineLayout",
           "PipelineRunner", "SkippedLayer", "StageModel", "broadcast_from_last_stage", "model_ends", "model_view", "rank_view",
           "split_stages", "stage_layer_ranges"]

class PipelineError(ValueError):
    """A pipeline split that cannot be built (the message names the key and the fix)."""


def stage_layer_ranges(num_layers: int, num_stages: int, first: int | None = None,
                       last: int | None = None, key: str = "pipeline_model_parallel_size") -> list[range]:
    """Consecutive layer ranges of ``num_stages`` stages: ``first`` / ``last`` layers on the end stages when given
    (verl's ``num_layers_in_{first,last}_pipeline_stage``), the rest split evenly."""
    if num_stages < 2:
        return [range(num_layers)]
    head = int(first) if first is not None else None
    tail = int(last) if last is not None else None
    middle_stages = num_stages - (head is not None) - (tail is not None)
    rest = num_layers - (head or 0) - (tail or 0)
    if rest < 0 or (middle_stages and rest % middle_stages) or (not middle_stages and rest):
        raise PipelineError(
            f"{key}: {num_layers} decoder layers cannot be split into {num_stages} stages"
            + (f" with {head} layers on the first" if head is not None else "")
            + (f" and {tail} on the last" if tail is not None else "")
            + ": the layers left must divide evenly among the other stages; change the sizes or set "
              "num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage")
    even = rest // middle_stages if middle_stages else 0
    sizes = ([head] if head is not None else []) + [even] * middle_stages + ([tail] if tail is not None else [])
    if min(sizes) < 1:
        raise PipelineError(f"{key}: a stage of {num_stages} over {num_layers} decoder layers would hold no layer")
    starts = [sum(sizes[:i]) for i in range(num_stages)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


@dataclass(frozen=True)
class PipelineLayout:
    """``pp`` ranks x ``vpp`` virtual stages each, the layers of every stage, and the schedule."""

    pp: int
    vpp: int
    ranges: tuple[range, ...]
    schedule: str = "1f1b"

    @property
    def num_stages(self) -> int:
        return self.pp * self.vpp

    def stage_ids(self, pp_rank: int) -> list[int]:
        """The stages of pipeline rank ``pp_rank`` (interleaved: ``pp_rank``, ``pp_rank + pp``, ...)."""
        return [pp_rank + k * self.pp for k in range(self.vpp)]


class SkippedLayer(nn.Module):
    """A decoder layer that lives on another stage: returns the hidden states it is given."""

    def __init__(self, index: int, attention_type: str | None = None):
        super().__init__()
        self.index = index
        if attention_type is not None:  # the mask a layer of this index would read (sliding windows)
            self.attention_type = attention_type

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


def _shallow_view(module: nn.Module) -> nn.Module:
    """A new module object with the same attributes: its submodule slots can be reassigned without touching the
    original (parameters and buffers stay shared)."""
    view = copy.copy(module)
    view._modules = dict(module._modules)
    view._parameters = dict(module._parameters)
    view._buffers = dict(module._buffers)
    return view


def model_ends(model: nn.Module) -> tuple[str, str | None, bool]:
    """:func:`~hybridflow.engine.transformers_adapter.embedding_and_head` with the names as paths in ``model``
    itself (under a PEFT wrapper they lie below ``base_model.model``)."""
    emb, head, tied = embedding_and_head(model)
    base = unwrap_peft(model)
    prefix = next(n for n, m in model.named_modules() if m is base)
    if prefix:
        emb, head = f"{prefix}.{emb}", (f"{prefix}.{head}" if head is not None else None)
    return emb, head, tied


def model_view(model: nn.Module, layers, first: bool, last: bool) -> tuple[nn.Module, str]:
    """A view of ``model`` holding the decoder layers in ``layers`` (the others :class:`SkippedLayer`), the input
    embedding when ``first``, the final norm and the head when ``last``; returns it and the decoder's path in it.
    Containers are copied, modules shared: the original model is untouched and no parameter is copied."""
    keep = set(layers)
    view = _shallow_view(model)
    decoder = decoder_stack(model)
    path = next(n for n, m in model.named_modules() if m is decoder)
    new_decoder = _shallow_view(decoder)
    new_decoder._modules["layers"] = nn.ModuleList(
        layer if i in keep else SkippedLayer(i, getattr(layer, "attention_type", None))
        for i, layer in enumerate(decoder.layers))
    if not last:  # the final norm belongs to the last stage
        norm_name = next((n for n in ("norm", "final_layernorm", "ln_f") if n in decoder._modules), None)
        if norm_name is not None:
            new_decoder._modules[norm_name] = nn.Identity()
    if path:
        _set_submodule(view, path, new_decoder)
    else:
        view = new_decoder
    emb_name, _, _ = model_ends(model)
    if not first:
        _set_submodule(view, emb_name, _Absent(emb_name))
        tower = vision_tower(model)  # a vision-language model's tower feeds the first stage only
        if tower is not None:
            _set_submodule(view, tower[0], _Absent(tower[0]))
    if not last:  # the heads (a vocabulary projection, a critic's score) belong to the last stage
        for name in _head_paths(model, path):
            _set_submodule(view, name, _Absent(name))
    return view, path


def _backbone_path(model: nn.Module, decoder_path: str) -> str:
    """Path of the child of the (PEFT-unwrapped) model that holds the decoder."""
    base = unwrap_peft(model)
    prefix = next(n for n, m in model.named_modules() if m is base)
    for name, _ in base.named_children():
        full = f"{prefix}.{name}" if prefix else name
        if decoder_path == full or decoder_path.startswith(full + "."):
            return full
    return decoder_path


def _head_paths(model: nn.Module, decoder_path: str) -> list[str]:
    """Paths of the modules with parameters beside the decoder at the top of the (PEFT-unwrapped) model: the LM
    head, a value or score head."""
    base = unwrap_peft(model)
    prefix = next(n for n, m in model.named_modules() if m is base)
    out = []
    for name, child in base.named_children():
        full = f"{prefix}.{name}" if prefix else name
        holds_decoder = decoder_path == full or decoder_path.startswith(full + ".")
        if not holds_decoder and next(child.parameters(), None) is not None:
            out.append(full)
    return out


def rank_view(model: nn.Module, stages: list["StageModel"]) -> nn.Module:
    """The model as one pipeline rank holds it: the layers of all its stages, the ends of the first / last."""
    layers = {i for s in stages for i in s.layers}
    view, _ = model_view(model, layers, any(s.is_first for s in stages), any(s.is_last for s in stages))
    return view


class StageModel(nn.Module):
    """One pipeline stage of ``model`` (see the module docstring)."""

    def __init__(self, model: nn.Module, index: int, num_stages: int, layers: range):
        super().__init__()
        self.index, self.num_stages, self.layers = index, num_stages, layers
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.model, self._decoder_path = model_view(model, layers, self.is_first, self.is_last)
        # the top module holding the decoder: the decoder itself in a causal LM, a VLM's backbone (tower + decoder)
        self._backbone_path = _backbone_path(self.model, self._decoder_path)
        self.pass_info: PassInfo | None = None  # set by the runner for the pass in flight

    @property
    def decoder(self) -> nn.Module:
        return self.model.get_submodule(self._decoder_path) if self._decoder_path else self.model

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, ids: torch.Tensor,
                mb_index: torch.Tensor):
        """One micro-batch: its inputs cut back to its own shape, the stage run on them (the head on the last
        stage), the outputs padded to the pass's shape for the next stage.  With sequence parallelism every stage
        works on this rank's slice of the micro-batch's packed row (``PassOptions.seq_slices``): the first stage
        cuts the token ids, the hidden states that travel between stages are the slice's.  ``position_ids`` travel
        as (rows, L) or, for M-RoPE, (rows, 4, L) and reach the model as ``model_position_ids`` gives them."""
        info = self.pass_info
        if info is None:
            raise RuntimeError("a pipeline stage was run outside a pass of its runner")
        opts = info.options
        i = int(mb_index.reshape(-1)[0])
        rows, length = info.sizes[i]
        local = opts.seq_slices[i] if opts.seq_slices is not None else slice(0, length)
        cut = (slice(0, rows), slice(0, length))
        mask_i, ids_i = attention_mask[cut], ids[cut]
        pos_i = model_position_ids(position_ids[:rows, ..., :length][..., local], packed=opts.packed)
        x_i = x[cut][:, local] if self.is_first else x[:rows, : local.stop - local.start]
        pass_rows, pass_length = ids.shape[:2]
        with opts.context(i) as extra:  # keyword arguments of the model call (a packed row's layout)
            extra = extra or {}
            if self.is_last:
                out = info.head(_FedModel(self.model, None if self.is_first else x_i, extra), ids_i,
                                None if opts.packed else mask_i, pos_i, i)
                return _pad_to(out.float(), info.head.shape(pass_rows, pass_length))
            mask_arg = None if opts.packed else mask_i
            if self.is_first and opts.first_inputs is not None:
                hidden = self._first_with_inputs(x_i, mask_arg, pos_i, extra, opts.first_inputs(i))
            else:
                embeds = {"input_ids": x_i} if self.is_first else {"inputs_embeds": x_i}
                hidden = self.decoder(**embeds, attention_mask=mask_arg, position_ids=pos_i, use_cache=False,
                                      **extra).last_hidden_state
        return (_pad_to(hidden, (pass_rows, pass_length // opts.sp, hidden.shape[-1])), attention_mask, position_ids,
                ids, mb_index)

    def _first_with_inputs(self, ids: torch.Tensor, mask, pos, extra: dict, inputs: dict[str, Any]) -> torch.Tensor:
        """The first stage of a vision-language model: its backbone (vision tower, the image features put in the
        token embeddings, this stage's layers) on the micro-batch's pixels; a sharded tower runs on a blank image
        when the micro-batch has none (every data rank gathers the same FSDP units)."""
        backbone = self.model.get_submodule(self._backbone_path)
        sharded = any(hasattr(m, "unshard") for m in (self, self.model))
        with vision_in_every_step(self.model, bool(inputs), sharded):
            out = backbone(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **inputs, **extra)
        return out.last_hidden_state


@dataclass
class PassOptions:
    """How a pass's micro-batches are laid out and run, beyond their tokens: the context each stage runs in (its
    keyword arguments for the model call: a packed row's attention, the sequence-parallel layout), whether the rows
    are packed (no attention mask), this rank's slice of each packed row under sequence parallelism and the group's
    size (the hidden states between stages are then ``pass_length // sp`` long), and the first stage's extra model
    inputs of each micro-batch (a vision-language model's pixels and grids)."""

    context: Callable[[int], Any] = lambda i: contextlib.nullcontext({})
    packed: bool = False
    seq_slices: list[slice] | None = None
    sp: int = 1
    first_inputs: Callable[[int], dict[str, Any]] | None = None


@dataclass
class PassInfo:
    """What every stage needs to know of the pass in flight: each micro-batch's own (rows, length), the last
    stage's head and the pass's :class:`PassOptions`."""

    sizes: list[tuple[int, int]]
    head: "PipelineHead"
    options: PassOptions


def _pad_to(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t`` in the top-left corner of zeros of ``shape`` -- always a new tensor, also when ``t`` has the shape
    already: FSDP hangs its backward hooks on the stage's outputs, and their order must not depend on whether a
    micro-batch happens to be the pass's longest (ranks of one data-parallel group would gather different
    parameter groups at once)."""
    full = t.new_zeros(shape)
    full[tuple(slice(0, n) for n in t.shape)] = t
    return full


class _Absent(nn.Module):
    """A module that lives on another stage; calling it is a bug in the split."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def forward(self, *args: Any, **kwargs: Any):
        raise RuntimeError(f"{self.name} lives on another pipeline stage")


class _FedModel:
    """The stage's model as the head calls it (``model(input_ids=..., ...)``), fed the received hidden states and
    the pass's extra keyword arguments."""

    def __init__(self, model: nn.Module, hidden: torch.Tensor | None, extra: dict[str, Any] | None = None):
        self.model, self.hidden, self.extra = model, hidden, dict(extra or {})

    def __call__(self, input_ids: torch.Tensor | None = None, **kwargs: Any):
        kwargs = {**self.extra, **kwargs}
        if self.hidden is None:
            return self.model(input_ids=input_ids, **kwargs)
        return self.model(inputs_embeds=self.hidden, **kwargs)

    def get_base_model(self) -> nn.Module:
        """The model itself, for the heads' introspection of its forward's parameters (``logits_to_keep``)."""
        base = getattr(self.model, "get_base_model", None)
        return base() if callable(base) else self.model

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    """Put ``module`` at ``path`` under ``root``, copying the containers on the way so the original is untouched."""
    if not path:
        raise ValueError("cannot replace the root")
    parent_path, _, name = path.rpartition(".")
    parent = root
    if parent_path:
        for part in parent_path.split("."):
            child = _shallow_view(parent._modules[part])
            parent._modules[part] = child
            parent = child
    parent._modules[name] = module


def split_stages(model: nn.Module, layout: PipelineLayout, pp_rank: int) -> list[StageModel]:
    """The stages of ``model`` that pipeline rank ``pp_rank`` runs (one per virtual stage)."""
    return [StageModel(model, s, layout.num_stages, layout.ranges[s]) for s in layout.stage_ids(pp_rank)]


# ---------------------------------------------------------------------------------------------- running a pass
class PipelineHead(Protocol):
    """What the last stage computes for one pass: ``(model, ids, attention_mask, position_ids, mb_index) -> (b, ...)``
    outputs of one micro-batch, padded to ``shape(rows, length)``."""

    def __call__(self, model: Any, ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 mb_index: int) -> torch.Tensor: ...

    def shape(self, rows: int, length: int) -> tuple[int, ...]: ...


@dataclass
class MicroBatchInputs:
    """A micro-batch's model inputs as the first stage takes them: (b, L) ids, mask and positions."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor


class PipelineRunner:
    """Runs passes of micro-batches through this rank's stages with the layout's schedule (``1f1b`` | ``gpipe``, config/checks/megatron.py)."""

    def __init__(self, stages: list[StageModel], layout: PipelineLayout, group, device: torch.device,
                 hidden_size: int, compute_dtype: torch.dtype):
        self.stages, self.layout, self.group, self.device = stages, layout, group, torch.device(device)
        self.hidden_size, self.compute_dtype = int(hidden_size), compute_dtype

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    def train(self, micro_batches: list[MicroBatchInputs], head: PipelineHead,
              loss: Callable[[torch.Tensor, int], torch.Tensor], options: PassOptions | None = None) -> None:
        """Forward and backward of every micro-batch (gradients accumulate in the stages' parameters);
        ``loss(output, i)``: micro-batch ``i``'s loss from its head output (padded to the pass's ``head.shape``). ``context(i)``: the
        context micro-batch ``i`` runs in on every stage; ``packed``: the rows are packed (no attention mask)."""
        self._run(micro_batches, head, loss, options or PassOptions())

    @torch.no_grad()
    def forward(self, micro_batches: list[MicroBatchInputs], head: PipelineHead,
                options: PassOptions | None = None) -> list[torch.Tensor] | None:
        """The head's outputs of every micro-batch (padded to the pass's ``head.shape``) on the rank holding the last
        stage, else ``None``."""
        return self._run(micro_batches, head, None, options or PassOptions())

    def _run(self, micro_batches, head, loss, options: PassOptions):
        from torch.distributed.pipelining import PipelineStage

        backward = loss is not None
        n = len(micro_batches)
        rows = max(mb.input_ids.shape[0] for mb in micro_batches)
        length = max(mb.input_ids.shape[1] for mb in micro_batches)
        ids, mask, pos = (self._stack([getattr(mb, k) for mb in micro_batches], rows, length)
                          for k in ("input_ids", "attention_mask", "position_ids"))
        index = torch.arange(n, device=self.device).repeat_interleave(rows)
        sizes = [tuple(mb.input_ids.shape[:2]) for mb in micro_batches]
        info = PassInfo(sizes, head, options)
        sp, pos_rows = options.sp, micro_batches[0].position_ids.shape[1:-1]  # (): (b, L) positions; (4,): M-RoPE
        for stage in self.stages:
            stage.pass_info = info
        pipe_stages = [PipelineStage(s, s.index, s.num_stages, self.device,
                                     input_args=self._meta_in(s, rows, length, backward, sp, pos_rows),
                                     output_args=self._meta_out(s, rows, length, head, backward, sp, pos_rows),
                                     group=self.group) for s in self.stages]
        loss_fn = (lambda output, target: loss(output, int(target[0]))) if backward else None
        schedule = self._schedule(pipe_stages, n, loss_fn)
        args = (ids, mask, pos, ids, index) if self.has_first else ()
        target = index.float() if self.has_last and backward else None
        try:
            if backward:
                schedule.step(*args, target=target, return_outputs=False)
                return None
            out = schedule.eval(*args)
        finally:
            for stage in self.stages:
                stage.pass_info = None
        if not self.has_last:
            return None
        return list(out.split(head.shape(rows, length)[0], dim=0))

    def _stack(self, tensors: list[torch.Tensor], rows: int, length: int) -> torch.Tensor:
        """The micro-batches' (b, [k,] L) tensors padded to (rows, [k,] length) and stacked along the rows."""
        out = tensors[0].new_zeros((len(tensors) * rows, *tensors[0].shape[1:-1], length))
        for i, t in enumerate(tensors):
            out[i * rows: i * rows + t.shape[0], ..., : t.shape[-1]] = t
        return out.to(self.device)

    def _meta_in(self, stage: StageModel, rows: int, length: int, backward: bool, sp: int = 1,
                 pos_rows: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        ints = [torch.empty(rows, *shape, length, dtype=torch.long, device="meta") for shape in ((), pos_rows, ())]
        first = (torch.empty(rows, length, dtype=torch.long, device="meta") if stage.is_first
                 else torch.empty(rows, length // sp, self.hidden_size, dtype=self.compute_dtype, device="meta",
                                  requires_grad=backward))
        return (first, *ints, torch.empty(rows, dtype=torch.long, device="meta"))

    def _meta_out(self, stage: StageModel, rows: int, length: int, head: PipelineHead, backward: bool, sp: int = 1,
                  pos_rows: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
        if stage.is_last:
            return (torch.empty(head.shape(rows, length), dtype=torch.float32, device="meta", requires_grad=backward),)
        hidden = torch.empty(rows, length // sp, self.hidden_size, dtype=self.compute_dtype, device="meta",
                             requires_grad=backward)
        ints = [torch.empty(rows, *shape, length, dtype=torch.long, device="meta") for shape in ((), pos_rows, ())]
        return (hidden, *ints, torch.empty(rows, dtype=torch.long, device="meta"))

    def _schedule(self, pipe_stages, n: int, loss_fn):
        """torch's schedule for ``n`` micro-batches.  One stage per rank: 1F1B (``gpipe``: all forwards, then all
        backwards; also when there are fewer micro-batches than stages, where 1F1B has nothing to interleave).
        Virtual stages: interleaved 1F1B, or looped breadth-first (GPipe's order over the virtual stages) for
        ``gpipe`` and for counts interleaved 1F1B cannot split into equal rounds of ``pp``."""
        from torch.distributed.pipelining import (
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
            ScheduleLoopedBFS,
        )

        pp = self.layout.pp
        if len(pipe_stages) > 1:
            rounds = max(1, n // pp)
            if self.layout.schedule != "gpipe" and n % rounds == 0:
                return ScheduleInterleaved1F1B(pipe_stages, n, loss_fn=loss_fn, scale_grads=False)
            return ScheduleLoopedBFS(pipe_stages, n, loss_fn=loss_fn, scale_grads=False)
        cls = ScheduleGPipe if self.layout.schedule == "gpipe" or n < pp else Schedule1F1B
        return cls(pipe_stages[0], n, loss_fn=loss_fn, scale_grads=False)


def broadcast_from_last_stage(tensors: list[torch.Tensor] | None, runner: PipelineRunner,
                              shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """The last stage's outputs on every rank of the pipeline group (``shapes``: each output's shape)."""
    group = runner.group
    ranks = dist.get_process_group_ranks(group)
    src = ranks[(runner.layout.num_stages - 1) % runner.layout.pp]
    out = []
    for i, shape in enumerate(shapes):
        t = tensors[i].contiguous() if tensors is not None else torch.empty(shape, dtype=torch.float32,
                                                                              device=runner.device)
        dist.broadcast(t, src=src, group=group)
        out.append(t)
    return out
