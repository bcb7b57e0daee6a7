"""Training layout -> rollout layout with no redundant copy: each rank receives only the slices its rollout shard
needs (the 3D-HybridEngine's transition, HybridFlow §5).

The actor trains on dp x pp x tp x ep x sp: a rank holds a box of every parameter it has (its tp / ep piece, further
cut over the FSDP ranks; a pipeline rank holds only its stages' parameters).  The rollout splits the model over its
own shard groups (tp_r ranks, ``rollout/hf/shard_model.py``): a rank needs another box of each parameter.  Both
boxes are contiguous ranges on every dimension (nested ``torch.chunk`` splits), so what rank ``r`` needs from rank
``s`` is the intersection of two boxes.  The :class:`SwitchPlan`, computed once from every rank's boxes (one
``all_gather_object`` of a few integers per parameter), says for each parameter and each receiving rank which rank
sends which box: the receiver itself when it holds the piece (a local copy, nothing on the wire), else one of the
ranks holding it (spread over them by the receiver's rank).

:func:`switch_to_rollout` then walks the parameters in a fixed order, bucket by bucket (``bucket_bytes`` of full
tensors), packs what this rank sends into one buffer, exchanges the buffers with one ``all_to_all_single`` per
bucket and copies what arrives into the rollout shard: beyond its training shards and its rollout shard a rank
holds one bucket's send and receive buffers.  Where the rollout shard *is* the training tensor (the same storage:
the engine generates with the actor's own module) nothing is copied.  Persistent buffers (a router's correction
bias) travel like parameters.

Between generations the rollout shard can go: :func:`release_shard` frees the storage of every rollout tensor the
switch fills and the training does not share (the switch writes every element of them, so nothing is lost), and
:func:`restore_shard` gives it back, uninitialised, right before the next switch fills it -- during training a rank
then holds its training shards only, as the paper's engine does.

A :class:`~hybridflow.engine.transfer_stats.TransferStats` says what moved: ``bytes`` the bytes this rank sent to
other ranks, ``received_bytes`` what it received, ``bytes_total`` the bytes of its rollout shard, ``buckets``, ``max_bucket_bytes`` (send + receive
buffers of the largest bucket), ``seconds`` and ``peak_rss_rise_bytes``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.engine.transfer_stats import TransferStats

__all__ = ["Box", "SwitchPlan", "Transfer", "intersect", "local_box", "plan_switch", "held_bytes", "release_shard",
           "restore_shard", "switch_to_rollout"]

Box = tuple[tuple[int, int], ...]  # [start, stop) per dimension
_ALIGN = 16  # bytes: every piece starts aligned in the packed buffers (viewed as its own dtype)


def intersect(a: Box, b: Box) -> Box | None:
    """The common box of ``a`` and ``b``; ``None`` when it is empty."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def local_box(tensor: torch.Tensor) -> Box:
    """The box of the global tensor this rank stores (a ``DTensor``'s local piece; a plain tensor is whole)."""
    if hasattr(tensor, "device_mesh"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
        return tuple((int(o), int(o) + int(s)) for o, s in zip(offset, shape))
    return tuple((0, int(n)) for n in tensor.shape)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _slice(local: torch.Tensor, box: Box, within: Box) -> torch.Tensor:
    """The part ``box`` of ``local``, which stores the box ``within`` of the global tensor."""
    return local[tuple(slice(lo - w0, hi - w0) for (lo, hi), (w0, _) in zip(box, within))]


def _numel(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


@dataclass(frozen=True)
class Transfer:
    """One box of one parameter from ``sender`` to ``receiver``."""

    sender: int
    receiver: int
    box: Box


@dataclass
class SwitchPlan:
    """What moves for every parameter of the rollout module (``names``, in order)."""

    names: list[str]
    train_boxes: list[list[Box | None]]  # [rank][i]
    rollout_boxes: list[list[Box]]  # [rank][i]
    transfers: list[list[Transfer]]  # [i]
    full_bytes: list[int]  # [i] bytes of the whole tensor
    element_size: list[int]
    shared: list[bool] = field(default_factory=list)  # [i] this rank's rollout tensor is its training tensor

    def redundancy(self, rank: int) -> int:
        """Bytes of this rank's rollout shard that are not part of its training shards (what the switch adds)."""
        total = 0
        for i, need in enumerate(self.rollout_boxes[rank]):
            own = self.train_boxes[rank][i]
            common = intersect(need, own) if own is not None else None
            total += (_numel(need) - (_numel(common) if common else 0)) * self.element_size[i]
        return total


def _state_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and persistent buffers by name, a tensor stored under two names (tied embeddings) once."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in module.state_dict(keep_vars=True).items():
        key = id(tensor)
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor
    return out


def _assign(i: int, world: int, train: list[list[Box | None]], need: list[list[Box]]) -> list[Transfer]:
    """Senders of parameter ``i`` for every receiving rank.  The distinct training boxes tile the tensor (ranks
    holding the same piece hold the same box); each receiver gets every piece it needs from itself when it holds
    it, else from one of its holders (chosen by the receiver's rank, so that the load spreads over them)."""
    holders: dict[Box, list[int]] = {}
    for r in range(world):
        box = train[r][i]
        if box is not None and _numel(box):
            holders.setdefault(box, []).append(r)
    out = []
    for r in range(world):
        for box, ranks in holders.items():
            common = intersect(box, need[r][i])
            if common is not None:
                out.append(Transfer(r if r in ranks else ranks[r % len(ranks)], r, common))
    return out


def _training(train: nn.Module | Mapping) -> Mapping:
    """The training tensors by name: a module's state, or a mapping given as is (a LoRA actor's merged pieces,
    ``engine/lora_pieces.py``)."""
    return train if isinstance(train, Mapping) else _state_tensors(train)


def plan_switch(train_module: nn.Module | Mapping, rollout_module: nn.Module, group=None) -> SwitchPlan:
    """The plan of the switch (a collective over ``group``, the default group when ``None``): every rank's boxes
    gathered, the senders chosen.  Raises ``ValueError`` when the training ranks together lack part of a tensor."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    train = _training(train_module)
    stored = getattr(train, "stored", train.__getitem__)  # the tensor as stored: its box, no merging
    rollout = _state_tensors(rollout_module)
    names = list(rollout)
    mine = [(local_box(stored(n)) if n in train else None, local_box(rollout[n])) for n in names]
    every: list = [None] * world
    dist.all_gather_object(every, mine, group=group)
    train_boxes = [[b[0] for b in per_rank] for per_rank in every]
    rollout_boxes = [[b[1] for b in per_rank] for per_rank in every]
    transfers = []
    for i, name in enumerate(names):
        moves = _assign(i, world, train_boxes, rollout_boxes)
        for r in range(world):
            got = sum(_numel(t.box) for t in moves if t.receiver == r)
            if got != _numel(rollout_boxes[r][i]):
                raise ValueError(f"the switch to the rollout layout: no training rank holds part of {name!r} "
                                 f"(rank {r} needs {rollout_boxes[r][i]}, the training ranks cover {got} of its "
                                 f"{_numel(rollout_boxes[r][i])} elements)")
        transfers.append(moves)
    t = rollout
    shared = [n in train and _local(stored(n)).data_ptr() == _local(t[n]).data_ptr() for n in names]
    return SwitchPlan(names, train_boxes, rollout_boxes, transfers,
                      [t[n].numel() * t[n].element_size() for n in names], [t[n].element_size() for n in names],
                      shared)


def _buckets(plan: SwitchPlan, bucket_bytes: int, indices: list[int] | None = None) -> Iterator[list[int]]:
    bucket: list[int] = []
    size = 0
    for i in range(len(plan.names)) if indices is None else indices:
        nbytes = plan.full_bytes[i]
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append(i)
        size += nbytes
    if bucket:
        yield bucket


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _all_to_all(recv: torch.Tensor, send: torch.Tensor, recv_splits: list[int], send_splits: list[int],
                group) -> None:
    """``all_to_all_single``; device buffers go through host memory when the group is gloo's (ranks sharing a GPU)."""
    if send.device.type != "cpu" and dist.get_backend(group) == "gloo":
        host = torch.empty(recv.shape, dtype=recv.dtype)
        dist.all_to_all_single(host, send.cpu(), recv_splits, send_splits, group=group)
        recv.copy_(host)
        return
    dist.all_to_all_single(recv, send, recv_splits, send_splits, group=group)


def _exchange_bucket(plan: SwitchPlan, bucket: list[int], rank: int, world: int, train: dict, rollout: dict,
                     group, stats: TransferStats) -> None:
    """One bucket: local copies, then the packed pieces to and from every other rank in one all-to-all."""
    sends: list[list[tuple[int, Transfer]]] = [[] for _ in range(world)]
    recvs: list[list[tuple[int, Transfer]]] = [[] for _ in range(world)]
    # this bucket's training pieces, read once (a LoRA actor's merged pieces: a collective each, same order on
    # every rank), dropped with the bucket
    train = {plan.names[i]: train[plan.names[i]] for i in bucket if plan.names[i] in train}
    for i in bucket:
        name = plan.names[i]
        for t in plan.transfers[i]:
            if t.sender == rank and t.receiver == rank:
                if not plan.shared[i]:
                    _slice(_local(rollout[name]), t.box, plan.rollout_boxes[rank][i]).copy_(
                        _slice(_local(train[name]), t.box, plan.train_boxes[rank][i]))
            elif t.sender == rank:
                sends[t.receiver].append((i, t))
            elif t.receiver == rank:
                recvs[t.sender].append((i, t))
    size = lambda i, t: _padded(_numel(t.box) * plan.element_size[i])  # noqa: E731
    send_splits = [sum(size(i, t) for i, t in pieces) for pieces in sends]
    recv_splits = [sum(size(i, t) for i, t in pieces) for pieces in recvs]
    device = _local(next(iter(rollout.values()))).device
    send = torch.empty(sum(send_splits), dtype=torch.uint8, device=device)
    offset = 0
    for pieces in sends:
        for i, t in pieces:
            src = _slice(_local(train[plan.names[i]]), t.box, plan.train_boxes[rank][i])
            send[offset:offset + src.numel() * src.element_size()].view(src.dtype).view(src.shape).copy_(src)
            offset += size(i, t)
    recv = torch.empty(sum(recv_splits), dtype=torch.uint8, device=device)
    if world > 1:  # a collective: every rank takes part in every bucket, sending or not
        _all_to_all(recv, send, recv_splits, send_splits, group)
    offset = 0
    for pieces in recvs:
        for i, t in pieces:
            dst = _slice(_local(rollout[plan.names[i]]), t.box, plan.rollout_boxes[rank][i])
            dst.copy_(recv[offset:offset + dst.numel() * dst.element_size()].view(dst.dtype).view(dst.shape))
            offset += size(i, t)
    stats.bytes += sum(send_splits)
    stats.received_bytes += sum(recv_splits)
    stats.tensors += len(bucket)
    stats.max_bucket_bytes = max(stats.max_bucket_bytes, int(send.numel() + recv.numel()))


def switch_to_rollout(train_module: nn.Module | Mapping, rollout_module: nn.Module, plan: SwitchPlan,
                      bucket_bytes: int, group=None, indices: list[int] | None = None) -> TransferStats:
    """Fill ``rollout_module``'s shards from ``train_module``'s along ``plan`` (a collective: every rank of
    ``group`` calls it with modules laid out as when the plan was made, and the same ``indices``: the tensors to
    move, all when None -- delta sync passes the changed ones).  Returns what moved (module docstring)."""
    from hybridflow.engine.reshard import measure_transition

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    train = _training(train_module)
    rollout = _state_tensors(rollout_module)
    stats = TransferStats()
    stats.tensors_total = len(plan.names)
    stats.bytes_total = sum(_numel(b) * plan.element_size[i] for i, b in enumerate(plan.rollout_boxes[rank]))
    with measure_transition(stats), torch.no_grad():
        for bucket in _buckets(plan, bucket_bytes, indices):
            _exchange_bucket(plan, bucket, rank, world, train, rollout, group, stats)
            stats.buckets += 1
    return stats


def release_shard(rollout_module: nn.Module, plan: SwitchPlan) -> dict[str, int]:
    """Free the storage of the rollout tensors the switch fills and training does not share; returns each freed
    tensor's storage bytes by name (for :func:`restore_shard`)."""
    rollout = _state_tensors(rollout_module)
    freed: dict[str, int] = {}
    for i, name in enumerate(plan.names):
        if plan.shared[i]:
            continue
        storage = _local(rollout[name]).untyped_storage()
        if storage.nbytes():
            freed[name] = storage.nbytes()
            storage.resize_(0)
    return freed


def restore_shard(rollout_module: nn.Module, freed: dict[str, int]) -> None:
    """Give the tensors :func:`release_shard` freed their storage back (uninitialised: the switch fills them)."""
    rollout = _state_tensors(rollout_module)
    for name, nbytes in freed.items():
        _local(rollout[name]).untyped_storage().resize_(nbytes)


def held_bytes(rollout_module: nn.Module, plan: SwitchPlan) -> int:
    """Bytes of storage this rank holds for the rollout tensors the training does not share."""
    rollout = _state_tensors(rollout_module)
    return sum(_local(rollout[n]).untyped_storage().nbytes() for i, n in enumerate(plan.names) if not plan.shared[i])

