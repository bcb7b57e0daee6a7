"""FSDP2 wrapping and the operations on a sharded module that do not depend on the RL role.

Sharding follows the layout recommended for FSDP2 (``torch.distributed.fsdp.fully_shard``): one
FSDP unit per transformer decoder layer, then one for the root (embeddings, final norm, head), so
only one layer's full parameters exist at a time during forward/backward.  The same code runs on
CPU ranks (gloo, fp32) and GPUs (NCCL, bf16 compute with fp32 gradient reduction); a process with
no ``torch.distributed`` group (the local backend) keeps a plain module and skips sharding.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.engine import device as dev
from hybridflow.engine.transformers_adapter import unwrap_peft

__all__ = [
    "is_distributed",
    "decoder_layer_classes",
    "apply_fsdp2",
    "apply_expert_fsdp2",
    "clip_gradients",
    "total_grad_norm",
    "fsdp_modules",
    "full_params",
    "full_state_dict",
    "move_module",
    "move_optimizer_state",
    "unwrap_peft",
]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def decoder_layer_classes(model: nn.Module, names: list[str] | None = None) -> set[type]:
    """Classes of the repeated transformer blocks: ``names`` (verl's ``wrap_policy.transformer_layer_cls_to_wrap``)
    when given, else HF's ``_no_split_modules`` declaration."""
    if names:
        found = {type(m) for m in model.modules() if type(m).__name__ in set(names)}
        missing = sorted(set(names) - {cls.__name__ for cls in found})
        if missing:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ValueError(f"fsdp_config.wrap_policy.transformer_layer_cls_to_wrap names {missing}, which "
                             f"{type(unwrap_peft(model)).__name__} does not contain; its module classes: {present}")
        return found
    names = set(getattr(unwrap_peft(model), "_no_split_modules", None) or [])
    found = {type(m) for m in model.modules() if type(m).__name__ in names}
    if not found:  # architectures without the declaration: the elements of the layer list
        for m in model.modules():
            if isinstance(m, nn.ModuleList) and len(m) > 0:
                found = {type(m[0])}
                break
    return found


def apply_fsdp2(
    model: nn.Module,
    mesh,
    param_dtype: torch.dtype = torch.float32,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    layer_cls_names: list[str] | None = None,
    forward_prefetch: bool = False,
    layer_types: tuple[type, ...] | None = None,
) -> nn.Module:
    """``fully_shard`` every decoder layer and then the root module over ``mesh`` (in place).

    ``layer_cls_names`` picks the classes to shard as units (default: HF's decoder layers; ``layer_types`` gives the
    classes themselves); with
    ``forward_prefetch`` each unit starts the all-gather of the next one during its own forward (depth 1,
    FSDP1's ``forward_prefetch`` and verl's FSDP2 setting).

    ``param_dtype`` is the compute dtype of the unsharded parameters (bf16 on GPU), gradients are
    reduced in ``reduce_dtype`` (fp32) and the sharded master weights stay in their load dtype.
    ``cpu_offload`` uses FSDP2's ``CPUOffloadPolicy`` (GPU only: on CPU the shards already live there).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if param_dtype != torch.float32 or reduce_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=True)
    if cpu_offload and dev.is_cuda():
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    if layer_types is None:  # (given for a pipeline stage: its own layer list may start with another stage's)
        layer_types = tuple(decoder_layer_classes(model, layer_cls_names))
    if not layer_types:
        raise ValueError(f"cannot find decoder layers to shard in {type(model).__name__}")
    units = []
    for module in model.modules():
        if isinstance(module, layer_types):
            fully_shard(module, **kwargs)
            units.append(module)
    fully_shard(model, **kwargs)
    if forward_prefetch:
        for unit, nxt in zip(units, units[1:]):
            unit.set_modules_to_forward_prefetch([nxt])
    return model


def apply_expert_fsdp2(experts: list[nn.Module], mesh, divide_factor: int, param_dtype: torch.dtype = torch.float32,
                       reduce_dtype: torch.dtype = torch.float32, reshard_after_forward: bool = True,
                       cpu_offload: bool = False) -> None:
    """``fully_shard`` each expert-parallel experts module over ``mesh`` (the ranks holding the same experts), before
    the decoder layers are sharded over the dense mesh; their gradients are divided by ``divide_factor``
    (``engine/expert_parallel.py`` says why)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if param_dtype != torch.float32 or reduce_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=True)
    if cpu_offload and dev.is_cuda():
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for module in experts:
        fully_shard(module, **kwargs)
        module.set_gradient_divide_factor(float(divide_factor))
        # gloo has no pre-multiplied sum: scale around a plain sum instead.  Not on a one-rank mesh, where no
        # collective runs and torch 2.13 would then divide twice (measured: 1/factor^2).
        if not dev.is_cuda() and mesh.size() > 1:
            module.set_force_sum_reduction_for_comms(True)


def total_grad_norm(params: list[nn.Parameter], stage_world: int | None = None,
                    skip: frozenset[int] = frozenset()) -> torch.Tensor:
    """The global 2-norm of the gradients of ``params``, whatever mesh each lives on (a collective over the world).

    Parameters of an N-D layout are ``DTensor`` s on different meshes (dense weights on dp x tp, experts on
    edp x ep, norms on dp only), which torch's ``clip_grad_norm_`` cannot combine.  Each rank adds the squares of
    its local pieces, weighted so that one all-reduce over the world counts every element once: a gradient on a
    mesh M with replicated dimensions of total size R exists in S / |M| copies of M, each holding every element
    R times, so its local squares are weighted by |M| / (S x R), where S is the ranks of one pipeline stage
    (``stage_world``: the world without pipeline parallelism; the stages hold different parameters, each counted
    by its own ranks).  ``skip``: ids of parameters whose gradient another stage counts (a tied embedding).
    """
    world = dist.get_world_size() if is_distributed() else 1
    stage = int(stage_world) if stage_world else world
    total = torch.zeros((), dtype=torch.float64)
    device = None
    for p in params:
        g = p.grad
        if g is None or id(p) in skip:
            continue
        local = g.to_local() if hasattr(g, "to_local") else g
        device = local.device
        weight = 1.0 / stage
        mesh = getattr(g, "device_mesh", None)
        if mesh is not None:
            replicated = 1
            for size, placement in zip(mesh.shape, g.placements):
                if placement.is_replicate():
                    replicated *= size
            weight = mesh.size() / (stage * replicated)
        total = total.to(local.device) + local.detach().double().pow(2).sum() * weight
    if world > 1:
        total = total.to(device if device is not None else "cpu")
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.sqrt()


def clip_gradients(params: list[nn.Parameter], max_norm: float, stage_world: int | None = None,
                   skip: frozenset[int] = frozenset()) -> float:
    """Scale the gradients so their global norm is at most ``max_norm``; returns the norm before clipping
    (``inf``/``nan`` untouched: the caller skips the step).  The coefficient is torch's: max_norm / (norm + 1e-6).
    ``stage_world`` / ``skip``: see :func:`total_grad_norm`."""
    norm = float(total_grad_norm(params, stage_world, skip))
    if math.isfinite(norm) and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    (p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).mul_(coef)
    return norm


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_params(model: nn.Module) -> Iterator[nn.Module]:
    """Hold every FSDP unit unsharded for the duration of the block (e.g. autoregressive generation).

    Generation runs a data-dependent number of forward passes (ranks stop at different EOS), which
    would deadlock if each pass all-gathered the layers.  So we all-gather once on entry (a
    collective every rank reaches), turn off resharding after forward, and reshard on exit: inside
    the block forward passes issue no collectives.  No-op for an unsharded (local) module.
    """
    units = fsdp_modules(model)
    if not units:
        yield model
        return
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False)
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU state dict: on rank 0 for a sharded model (``{}`` elsewhere), always locally."""
    if not fsdp_modules(model):
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def move_module(model: nn.Module, device: torch.device | str) -> None:
    """Move (sharded) parameters and gradients to ``device``: the param-offload round-trip.

    On a CPU-only machine the target is the CPU either way, so the move is free but exercised.
    """
    model.to(device)
    for p in model.parameters():
        if p.grad is not None and p.grad.device != torch.device(device):
            p.grad = p.grad.to(device)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move the optimizer's tensor state (Adam moments) to ``device``; the step counter stays put."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
