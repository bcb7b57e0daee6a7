"""``parallelize``: one role's model laid out over its ``ParallelDims``, the dimensions applied in one stated order.

    sequence  ->  expert  ->  tensor  ->  pipeline  ->  precision  ->  FSDP

1. **sequence** (Ulysses, ``engine/ulysses_forward.py``): the attention is checked and wrapped for the sp group;
2. **expert** (``engine/expert_parallel.py``): the MoE experts' weights become ``DTensor`` s sharded over ep;
3. **tensor** (``engine/tensor_parallel.py``): attention, MLP, embedding and head split over tp;
4. **pipeline** (``engine/parallel/pipeline.py``): the decoder cut into stages; this rank keeps its stages' views
   (modules shared with the model, other stages' layers dropped);
5. **precision**: the buffers in ``mixed_precision.buffer_dtype`` (FSDP2 leaves buffers to the module);
6. **FSDP2**: the experts over their expert-data-parallel mesh, then every decoder layer and the root (of each
   stage with pipeline parallelism) over the dense data dimensions.

``TrainEngine`` calls it and knows none of the order; what it gets back (:class:`ParallelModel`) is the module
this rank holds, the sequence-parallel handle and, with pp > 1, the pipeline runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from hybridflow.engine.expert_parallel import apply_expert_parallel, expert_gradient_divide_factor
from hybridflow.engine.fsdp import apply_expert_fsdp2, apply_fsdp2, decoder_layer_classes
from hybridflow.engine.parallel.pipeline import (
    PipelineLayout,
    PipelineRunner,
    StageModel,
    model_ends,
    rank_view,
    split_stages,
    stage_layer_ranges,
)
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.tensor_parallel import apply_tensor_parallel
from hybridflow.engine.transformers_adapter import text_config
from hybridflow.engine.ulysses_forward import SequenceParallel

if TYPE_CHECKING:
    from hybridflow.config.schema import FSDPConfig

__all__ = ["ParallelModel", "PipelineSpec", "parallelize", "pipeline_spec_for"]


@dataclass(frozen=True)
class PipelineSpec:
    """How the decoder is cut (verl's ``num_layers_in_{first,last}_pipeline_stage``) and scheduled."""

    first: int | None = None
    last: int | None = None
    schedule: str = "1f1b"


def pipeline_spec_for(node) -> PipelineSpec | None:
    """The pipeline a role's config node asks for (``None``: no pipeline): its ``megatron`` node's
    ``pipeline_model_parallel_size`` > 1 with the strategy ``megatron``, the split keys of
    ``override_transformer_config`` and ``pipeline_schedule``."""
    from hybridflow.config.checks.megatron import pipeline_split

    megatron = getattr(node, "megatron", None)
    if getattr(node, "strategy", None) != "megatron" or megatron is None:
        return None
    if int(getattr(megatron, "pipeline_model_parallel_size", 1) or 1) <= 1:
        return None
    first, last = pipeline_split(node)
    return PipelineSpec(first, last, str(getattr(megatron, "pipeline_schedule", "1f1b") or "1f1b"))


@dataclass
class ParallelModel:
    """What one rank holds after :func:`parallelize`."""

    module: nn.Module  # the model (with pp > 1: the view of this rank's stages, parameter names the model's own)
    sequence_parallel: SequenceParallel | None = None
    pipeline: PipelineRunner | None = None
    stages: list[StageModel] = field(default_factory=list)
    # pp > 1 and the model ties its input and output embeddings: (embedding name, head name)
    tied_embedding: tuple[str, str] | None = None


def parallelize(module: nn.Module, dims: ParallelDims, rank: int, device: torch.device, fsdp_config: FSDPConfig,
                precision: tuple[torch.dtype, torch.dtype, torch.dtype | None], fsdp_mesh,
                pipeline: PipelineSpec | None = None) -> ParallelModel:
    """Lay ``module`` out over ``dims`` (built), in the order of the module docstring; ``precision``: (compute,
    gradient-reduce, buffer) dtypes; ``fsdp_mesh``: the dense parameters' FSDP mesh (``None``: no sharding)."""
    compute, reduce, buffers = precision
    out = ParallelModel(module=module)
    if dims.sp_enabled:                                                                       # 1. sequence
        out.sequence_parallel = SequenceParallel.for_module(module, dims.sp_group, dims.sp,
                                                            dims.coordinate(rank)["sp"], dims.key, tp=dims.tp)
    module.to(device)
    experts = (apply_expert_parallel(module, dims.ep_mesh, dims.ep_key, dims.expert_token_split)  # 2. expert
               if dims.ep > 1 and dims.mesh is not None else [])
    if dims.tp > 1 and dims.mesh is not None:                                                 # 3. tensor
        apply_tensor_parallel(module, dims.tp_mesh, dims.tp_key, sequence_parallel=dims.tp_sp)
    layer_types = tuple(decoder_layer_classes(module, fsdp_config.wrap_policy.transformer_layer_cls_to_wrap))
    if dims.pp > 1:                                                                           # 4. pipeline
        _split_pipeline(out, dims, rank, device, compute, pipeline or PipelineSpec())
    if buffers is not None:                                                                   # 5. precision
        for buf in out.module.buffers():
            if buf.is_floating_point():
                buf.data = buf.data.to(buffers)
    kept = {id(m) for m in out.module.modules()}
    experts = [e for e in experts if id(e) in kept]  # (experts of other stages' layers are dropped)
    _shard(out, dims, fsdp_config, compute, reduce, fsdp_mesh, experts, layer_types)         # 6. FSDP
    return out


def _split_pipeline(out: ParallelModel, dims: ParallelDims, rank: int, device: torch.device, compute: torch.dtype,
                    spec: PipelineSpec) -> None:
    model = out.module
    cfg = text_config(model.config)
    num_layers = int(cfg.num_hidden_layers)
    ranges = stage_layer_ranges(num_layers, dims.pp * dims.vpp, spec.first, spec.last, dims.pp_key)
    layout = PipelineLayout(dims.pp, dims.vpp, tuple(ranges), spec.schedule)
    pp_rank = dims.pp_rank(rank)
    out.stages = split_stages(model, layout, pp_rank)
    out.module = rank_view(model, out.stages)  # the rank's holdings: its stages' layers and ends
    emb_name, head_name, tied = model_ends(model)
    out.tied_embedding = (emb_name, head_name) if tied else None
    out.pipeline = PipelineRunner(out.stages, layout, dims.pp_group, device, int(cfg.hidden_size), compute)


def _shard(out: ParallelModel, dims: ParallelDims, fsdp_config: FSDPConfig, compute: torch.dtype,
           reduce: torch.dtype, fsdp_mesh, experts: list[nn.Module], layer_types: tuple[type, ...]) -> None:
    common = dict(param_dtype=compute, reduce_dtype=reduce, reshard_after_forward=bool(fsdp_config.reshard_after_forward),
                  cpu_offload=bool(fsdp_config.offload_policy))
    if experts:
        apply_expert_fsdp2(experts, dims.expert_fsdp_mesh,
                           expert_gradient_divide_factor(dims.expert_fsdp_mesh.size(), dims.ep,
                                                         dims.tp if dims.ep_beyond_dp else 1), **common)
    if fsdp_mesh is None:
        return
    roots = out.stages if out.stages else [out.module]
    for root in roots:
        apply_fsdp2(root, fsdp_mesh, layer_types=layer_types, forward_prefetch=bool(fsdp_config.forward_prefetch),
                    **common)
