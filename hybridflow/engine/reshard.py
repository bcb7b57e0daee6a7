"""Training layout -> rollout layout, one bucket at a time (the 3D-HybridEngine transition).

The actor trains on a dp x sp x tp mesh (experts on ep x edp): every parameter is a ``DTensor`` whose pieces lie
on several ranks.  A rollout engine with its own copy of the weights (the ``hf`` engine next to an N-D actor,
whose module cannot generate while its layers are split over ranks) needs them whole.  Gathering the full state
dict first (``get_model_state_dict(full_state_dict=True)``) holds a second full copy of the model on every rank
until the engine has copied it.  :func:`reshard_in_buckets` instead walks the state dict in a fixed order (every
rank the same: each gather is a collective over the parameter's own mesh), gathers parameters until a bucket of
``bucket_bytes`` is full, hands the bucket to ``load`` (which copies it into the engine's weights), drops it and
goes on: beyond the engine's own weights a rank holds at most one bucket (plus the one parameter that overflows
it).

A :class:`~hybridflow.engine.transfer_stats.TransferStats` says what moved: tensors, bytes gathered, buckets, the
largest bucket, seconds, and the rise of the process's peak resident memory during the transition (Linux
``VmHWM``, reset before it starts).
``benchmarks/bench_reshard.py`` measures it against the full gather.

This path gathers every tensor whole on every rank: the engine it feeds holds a full replica.  The sharded ``hf``
engine (``actor_rollout_ref.rollout.tensor_model_parallel_size > 1``) is fed by :mod:`hybridflow.engine.shard_switch`
instead, where each rank receives only the slices of its rollout shard.

A LoRA actor (a peft model) is sent one of two ways, as the engine loads it (``lora``):

* ``"merge"`` -- the base weights with the adapters merged in (``W + scaling B A``, from the gathered ``W``, ``A``
  and ``B``), under the plain model's names: an engine holding a plain copy of the model (``hf``);
* ``"adapter"`` -- the adapter tensors only, under the peft names, all in one bucket (an engine that loads an
  adapter as a whole: vLLM with LoRA); the frozen base weights never move.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

import torch
from torch import nn

from hybridflow.engine.transfer_stats import TransferStats

__all__ = ["distinct_state_items", "gathered_buckets", "measure_transition", "peak_rss_bytes", "pipeline_full_tensors",
           "reset_peak_rss", "reshard_in_buckets"]

Bucket = list[tuple[str, torch.Tensor]]


def reset_peak_rss() -> bool:
    """Reset this process's peak resident memory (``VmHWM``) to its current size; False where not supported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int | None:
    """Peak resident memory of this process since start or the last :func:`reset_peak_rss` (Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _lora_layers(module: nn.Module) -> dict[str, nn.Module]:
    """``{name: peft LoRA layer}`` of a peft model (``{}`` for a plain model)."""
    if not hasattr(module, "peft_config"):
        return {}
    return {name: m for name, m in module.named_modules()
            if hasattr(m, "base_layer") and isinstance(getattr(m, "lora_A", None), nn.ModuleDict)}


def _delta(layer: nn.Module, adapter: str) -> torch.Tensor:
    """What ``adapter`` of a peft LoRA layer adds to the tensor it wraps, from the gathered ``A`` and ``B`` (a
    collective each): ``scaling x B A`` for a linear layer; for a ``ParamWrapper`` around a 3-D expert parameter
    (``num_experts`` stacked matrices: ``A`` experts x rank rows, ``B`` rank x experts columns) peft's own layout."""
    a = _full(layer.lora_A[adapter].weight).float()
    b = _full(layer.lora_B[adapter].weight).float()
    experts = int(getattr(layer, "num_experts", 1) or 1)
    if getattr(layer, "parameter_name", None) is None or experts == 1:
        delta = b @ a
        return (delta.T if getattr(layer, "fan_in_fan_out", False) else delta) * layer.scaling[adapter]
    a = a.reshape(experts, -1, a.shape[-1])  # e r i
    b = b.reshape(b.shape[0], -1, experts)  # o r e
    pattern = "o r e, e r i -> e o i" if getattr(layer, "_did_swap_in_out_features", False) else \
        "o r e, e r i -> e i o"
    return torch.einsum(pattern, b, a) * layer.scaling[adapter]


def _merged(tensor: torch.Tensor, layers: list[nn.Module]) -> torch.Tensor:
    """``tensor`` plus the active adapters' deltas of every LoRA layer wrapping it."""
    out = tensor.float()
    for layer in layers:
        for adapter in layer.lora_A:
            if adapter in layer.active_adapters:
                out = out + _delta(layer, adapter)
    return out.to(tensor.dtype)


def distinct_state_items(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's state dict in order (sharded tensors as they are), a tensor shared under two names (tied
    embeddings) once, under its first name."""
    seen: set[int] = set()
    for name, tensor in module.state_dict().items():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        key = local.data_ptr()
        if key and key in seen:
            continue
        seen.add(key)
        yield name, tensor


def _named_sources(module: nn.Module, lora: str) -> Iterator[tuple[str, torch.Tensor, list[nn.Module]]]:
    """(name sent, stored tensor, the LoRA layers whose adapters merge into it) in state-dict order, tied tensors once
    (first name); nothing is gathered yet (the full tensor has the stored one's shape and dtype).
    ``lora="raw"``: every tensor under its stored name (a checkpoint's view).  A module wrapped by peft more than
    once (MoE experts: one ``ParamWrapper`` per targeted parameter, each the ``base_layer`` of the next) loses every
    ``.base_layer`` of its name, and each wrapper targeting the parameter adds its delta."""
    layers = _lora_layers(module) if lora != "raw" else {}
    for name, tensor in distinct_state_items(module):
        if not layers:
            yield name, tensor, []
            continue
        is_adapter = ".lora_A." in name or ".lora_B." in name
        if lora == "adapter":
            if is_adapter:
                yield name, tensor, []
            continue
        if is_adapter:
            continue
        owner, _, leaf = name.rpartition(".")
        chain = []  # the peft layers around this tensor, innermost first
        while owner.endswith(".base_layer"):
            owner = owner.removesuffix(".base_layer")
            if owner in layers:
                chain.append(layers[owner])
        merging = [layer for layer in chain if _merges_into(layer, leaf)]
        yield f"{owner}.{leaf}".removeprefix("base_model.model."), tensor, merging


def _merges_into(layer: nn.Module, leaf: str) -> bool:
    """Whether ``layer``'s adapters change the wrapped tensor ``leaf``: a ``ParamWrapper`` the parameter it names,
    a linear LoRA layer its base weight."""
    target = getattr(layer, "parameter_name", None)
    return leaf == target if target is not None else leaf == "weight"


def _named_full_tensors(module: nn.Module, lora: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) in state-dict order, each gathered when reached; tied tensors once (first name)."""
    for name, tensor, merging in _named_sources(module, lora):
        full = _full(tensor)
        yield name, (_merged(full, merging) if merging else full)


def _comm_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return (p.to_local() if hasattr(p, "to_local") else p).device
    return torch.device("cpu")


def pipeline_full_tensors(module: nn.Module, lora: str, group,
                          tied_head: str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """With pipeline parallelism (``group``: this rank's pipeline peers, in stage order): every stage's full
    tensors, stage after stage, each gathered by the ranks of the stage that holds it (a collective inside that
    stage) and broadcast to the other stages -- so every rank sees the whole model one tensor at a time.  The
    stages first exchange their lists of (name, shape, dtype); a name held by two stages (the input embedding and
    a tied head) is yielded once, the first stage's.  ``tied_head``: the last stage's copy of a tied input
    embedding (its weight's name): not sent to an engine, whose model ties it to the embedding (``"raw"`` keeps it,
    as a state dict does)."""
    import torch.distributed as dist

    mine = [(name, tuple(t.shape), t.dtype) for name, t, _ in _named_sources(module, lora)]
    # the head's name as sent (a peft model's names lose their "base_model.model." prefix on the way)
    skip = {tied_head, tied_head.removeprefix("base_model.model.")} if tied_head is not None and lora != "raw" \
        else set()
    plans: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(plans, mine, group=group)
    ranks, me, device = dist.get_process_group_ranks(group), dist.get_rank(group), _comm_device(module)
    local = _named_full_tensors(module, lora)
    seen: set[str] = set()
    for stage, plan in enumerate(plans):
        for name, shape, dtype in plan:
            if stage == me:
                tensor = next(local)[1].detach().to(device).contiguous()
            else:
                tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(tensor, src=ranks[stage], group=group)
            if name not in seen and name not in skip:
                seen.add(name)
                yield name, tensor


def gathered_buckets(module: nn.Module, bucket_bytes: int, device: torch.device | str = "cpu",
                     stats: TransferStats | None = None, lora: str = "merge",
                     group_of: Callable[[str], object] | None = None, pipeline_group=None,
                     tied_head: str | None = None) -> Iterator[Bucket]:
    """The module's full tensors, gathered one parameter at a time and yielded in buckets of ``bucket_bytes``
    (a tensor larger than that forms its own bucket).  Every rank of the module's meshes must iterate to the end.
    A tensor stored under two names (tied embeddings) comes once, under its first name.  ``lora``: how a peft
    model's adapters travel (module docstring); ``"adapter"`` yields a single bucket.  ``group_of(name)``: tensors
    of one group (consecutive in the state dict) never straddle two buckets -- vLLM fuses q/k/v and gate/up into
    one parameter and a reload of part of it leaves the rest undefined -- so a bucket may overrun by one group.
    ``pipeline_group``: with pipeline parallelism, the rank's pipeline peers (every stage's tensors come, see
    :func:`pipeline_full_tensors`; ``tied_head`` the last stage's copy of a tied embedding, not sent)."""
    if lora not in ("merge", "adapter"):
        raise ValueError(f"lora={lora!r}: 'merge' (plain weights, adapters merged) or 'adapter' (adapter tensors)")
    if lora == "adapter" and _lora_layers(module):
        bucket_bytes = 1 << 62  # the engine loads the adapter as a whole
    bucket: Bucket = []
    size = 0
    tensors = (_named_full_tensors(module, lora) if pipeline_group is None
               else pipeline_full_tensors(module, lora, pipeline_group, tied_head))
    for name, full in tensors:
        full = full.detach().to(device)
        nbytes = full.numel() * full.element_size()
        same_group = bool(bucket) and group_of is not None and group_of(name) == group_of(bucket[-1][0])
        if bucket and size + nbytes > bucket_bytes and not same_group:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, full))
        size += nbytes
        if stats is not None:
            stats.count(1, nbytes)
            stats.max_bucket_bytes = max(stats.max_bucket_bytes, size)
    if bucket:
        yield bucket


@contextlib.contextmanager
def measure_transition(stats: TransferStats) -> Iterator[None]:
    """Time the block into ``stats.seconds`` and record the rise of the peak memory during it: resident memory
    (``peak_rss_rise_bytes``, Linux) and, on CUDA, the device's peak allocation (``peak_device_bytes``)."""
    measured = reset_peak_rss()
    before = _rss_bytes() if measured else None
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        yield
    finally:
        stats.seconds = time.perf_counter() - start
        peak = peak_rss_bytes() if measured else None
        if peak is not None and before is not None:
            stats.peak_rss_rise_bytes = max(0, peak - before)
        stats.peak_rss_bytes = peak
        if cuda:
            stats.peak_device_bytes = int(torch.cuda.max_memory_allocated())


def reshard_in_buckets(module: nn.Module, load: Callable[[Bucket], object], bucket_bytes: int,
                       device: torch.device | str = "cpu", lora: str = "merge",
                       group_of: Callable[[str], object] | None = None, pipeline_group=None,
                       tied_head: str | None = None) -> TransferStats:
    """Gather ``module`` bucket by bucket and ``load`` each (copy it into the rollout engine's weights); returns the
    stats of the transition.  Collective: every rank calls it with the same module layout."""
    stats = TransferStats()
    with measure_transition(stats), torch.no_grad():
        for bucket in gathered_buckets(module, bucket_bytes, device, stats, lora, group_of, pipeline_group,
                                       tied_head):
            load(bucket)
            stats.buckets += 1
            del bucket
    return stats
