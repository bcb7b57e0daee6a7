"""Checksums of a split model, additive over its pieces: the split rollout engine's weight facts and delta sync.

A tensor's checksum is its sum and, per dimension, the sum of its values weighted by their global position along
that dimension (float64). Both add up over disjoint boxes, so the pieces the training ranks hold (each distinct box
once) sum to the whole tensor's checksum, and so do the pieces of each rollout group; a value missing, stale, or put
at the wrong place along any dimension changes it. After a switch every rollout group's sum must equal the training
ranks' sum (:func:`verify`); before one, a tensor whose training checksum has not changed since the last switch need
not travel (delta sync). The checksums are compared within a tolerance (``RTOL`` of the same sums over absolute
values), since two partitions of a tensor add its values in different orders.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.engine.shard_switch import _local

__all__ = ["RTOL", "ShardMismatchError", "box_checksum", "changed", "checksums", "rollout_sums", "training_totals", "verify"]

RTOL = 1e-9


class ShardMismatchError(RuntimeError):
    """A rollout shard does not hold the training weights after the switch (the message names group and tensor)."""


_CHUNK_ELEMENTS = 1 << 22  # float64 reductions upcast their input: read a piece 4 Mi elements (32 MiB) at a time


def box_checksum(local: torch.Tensor, box, ndim: int) -> torch.Tensor:
    """``[2, 1 + ndim]`` float64: the piece's sum and position-weighted sums per dimension, then the same over
    absolute values (the tolerance's scale). ``box`` is the piece's place in the global tensor. The piece is read in
    row chunks, so the float64 upcast never holds more than a chunk."""
    out = torch.zeros(2, 1 + ndim, dtype=torch.float64)
    if local.numel() == 0:
        return out
    x = local.detach()
    if x.dim() == 0:
        out[0, 0], out[1, 0] = float(x), float(x.abs())
        return out
    per_dim = [torch.zeros(2, hi - lo, dtype=torch.float64, device=x.device) for lo, hi in box]
    rows = max(1, _CHUNK_ELEMENTS // max(1, x[0].numel()))
    for start in range(0, x.shape[0], rows):
        chunk = x[start:start + rows]
        for row, values in enumerate((chunk, chunk.abs())):
            for d in range(x.dim()):
                others = [k for k in range(x.dim()) if k != d]
                per = values.sum(dim=others, dtype=torch.float64) if others else values.to(torch.float64)
                if d == 0:
                    per_dim[0][row, start:start + chunk.shape[0]] += per
                else:
                    per_dim[d][row] += per
    for d, (lo, hi) in enumerate(box):
        coords = torch.arange(lo + 1, hi + 1, dtype=torch.float64, device=x.device)
        out[:, 1 + d] = (per_dim[d] * coords).sum(dim=1).cpu()
    out[:, 0] = per_dim[0].sum(dim=1).cpu()
    return out


def checksums(tensors: dict[str, torch.Tensor], names: list[str], boxes: list, take: list[bool]) -> torch.Tensor:
    """``[len(names), 2, 3]`` (dimensions beyond two are folded into the last two columns' sum): the checksums of
    this rank's pieces ``boxes[i]`` of ``names[i]``, zero where ``take[i]`` is false (another rank counts it)."""
    out = torch.zeros(len(names), 2, 3, dtype=torch.float64)
    for i, name in enumerate(names):
        if boxes[i] is None or name not in tensors:
            continue
        local = _local(tensors[name])  # read on every rank holding it (a LoRA actor's merged piece: a collective)
        if not take[i]:
            continue
        box = boxes[i]
        c = box_checksum(local, box, len(box))
        out[i, :, 0] = c[:, 0]
        if c.shape[1] > 1:
            out[i, :, 1] = c[:, 1]
        if c.shape[1] > 2:
            out[i, :, 2] = c[:, 2:].sum(dim=1)
    return out


def _gather(local: torch.Tensor, group=None) -> list[torch.Tensor]:
    world = dist.get_world_size(group)
    every = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(every, local, group=group)
    return every


def training_totals(plan, train: dict[str, torch.Tensor], rank: int, group=None) -> torch.Tensor:
    """The whole tensors' checksums from the training pieces, each distinct box counted once (by its first holder;
    a collective)."""
    world = len(plan.train_boxes)
    take = []
    for i in range(len(plan.names)):
        mine = plan.train_boxes[rank][i]
        first = next((r for r in range(world) if plan.train_boxes[r][i] == mine), None) if mine is not None else None
        take.append(first == rank)
    local = checksums(train, plan.names, plan.train_boxes[rank], take)
    return torch.stack(_gather(local, group)).sum(0)


def rollout_sums(plan, rollout: dict[str, torch.Tensor], rank: int) -> torch.Tensor:
    """This rank's rollout pieces' checksums (every tensor)."""
    return checksums(rollout, plan.names, plan.rollout_boxes[rank], [True] * len(plan.names))


def changed(totals: torch.Tensor, previous: torch.Tensor | None) -> list[int]:
    """Indices of the tensors whose training checksum differs from ``previous`` (all without one)."""
    if previous is None or previous.shape != totals.shape:
        return list(range(totals.shape[0]))
    return [i for i in range(totals.shape[0]) if not torch.equal(totals[i], previous[i])]


def verify(plan, totals: torch.Tensor, mine: torch.Tensor, groups: list[tuple[int, ...]], group=None) -> dict:
    """Every rollout group's pieces must add up to the training totals (a collective: ``mine`` from every rank).
    Returns the weight fact (``match``, ``tensors``, ``worst_rel``); raises :class:`ShardMismatchError` naming the
    first group and tensor that do not."""
    every = _gather(mine, group)
    worst = 0.0
    for members in groups:
        for i, name in enumerate(plan.names):
            seen, total = set(), torch.zeros_like(totals[i])
            for r in members:
                box = plan.rollout_boxes[r][i]
                if box in seen:  # a tensor the group's ranks each hold whole (a norm's weight) counts once
                    continue
                seen.add(box)
                total += every[r][i]
            scale = totals[i, 1].abs() + total[1].abs()
            diff = (total[0] - totals[i, 0]).abs()
            rel = float((diff / scale.clamp_min(1e-300)).max())
            worst = max(worst, rel if bool((scale > 0).any()) else float(diff.max()))
            if bool((diff > RTOL * scale + 1e-300).any()):
                raise ShardMismatchError(
                    f"rollout shard group {list(members)} does not hold the training weights of {name!r} after the "
                    f"switch (checksum {total[0].tolist()} vs {totals[i, 0].tolist()}): a piece is missing, stale or "
                    "misplaced")
    return {"match": True, "tensors": len(plan.names), "worst_rel": worst}
