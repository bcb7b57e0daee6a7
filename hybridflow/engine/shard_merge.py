"""Put full tensors back together from the per-rank pieces of a checkpoint, whatever layout saved them.

A rank's checkpoint file holds its local piece of every parameter (and Adam moment) as a ``DTensor``: the
piece's placements say how it was cut on each dimension of the mesh, and the mesh (``DeviceMesh.mesh``, the
grid of global ranks) says where rank R sits.  FSDP2 alone cuts dimension 0 into contiguous chunks; with tensor
or expert parallelism FSDP2 cuts the model-parallel piece again (a ``_StridedShard``: the chunks of the
data-parallel cut interleave with those of the model-parallel one), and vocabulary or expert counts may split
unevenly.  Rather than re-deriving those rules, :func:`global_indices` replays DTensor's own splitting on an
index tensor (``Placement._split_tensor``, the function ``distribute_tensor`` uses), so the piece of rank R is
written back exactly where DTensor took it from.  ``tests/engine/test_tensor_parallel.py`` checks the result
against ``DTensor.full_tensor()`` for the layouts the engine builds (``hybridflow merge`` of each checkpoint case).

No process group is needed: ``hybridflow merge`` runs in a plain process, and a run resuming on another layout
reads every rank's file this way (``engine/engine_checkpoint.py``).
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["ShardMergeError", "global_indices", "load_pieces", "merge_pieces", "merge_state_dicts", "rank_coordinate"]


class ShardMergeError(ValueError):
    """The pieces do not make up a whole tensor (missing ranks, inconsistent layouts)."""


def load_pieces(path, map_location="cpu"):
    """A rank's checkpoint file, loaded safely (``utils/safe_load.py``: tensors, DTensors and their meshes and
    placements only).  Unpickling a ``DeviceMesh`` outside the process group that made it makes torch warn once
    per mesh and tensor that it found no process group (the mesh is only read here, never used for a
    collective): that warning is silenced for the duration of the load."""
    import logging

    from hybridflow.utils.safe_load import load_torch_file

    log = logging.getLogger("torch.distributed.device_mesh")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return load_torch_file(path, map_location=map_location)
    finally:
        log.setLevel(level)


def mesh_grid(mesh, rank: int) -> torch.Tensor:
    """The grid of global ranks of the copy of ``mesh`` that holds ``rank``.

    A mesh sliced out of a larger one (FSDP's dimension of a dp x tp mesh) exists in several copies; torch picks
    the copy of the *calling* process (which needs a process group).  Offline the rank is the file's, so the copy
    is picked from the full layout the mesh keeps (torch 2.13's ``_layout`` / ``_rank_map``)."""
    layout, rank_map = getattr(mesh, "_layout", None), getattr(mesh, "_rank_map", None)
    pick = getattr(type(mesh), "_get_mesh_tensor_from_full_mesh", None)
    if layout is None or rank_map is None or pick is None:
        return mesh.mesh
    return pick(layout.remap_to_tensor(rank_map), rank)


def rank_coordinate(mesh, rank: int) -> tuple[int, ...]:
    """Where global ``rank`` sits in ``mesh`` (one index per mesh dimension)."""
    # ``mesh.mesh`` is a property that asks the process group: look it up on the class, never on the instance
    grid = mesh_grid(mesh, rank) if hasattr(type(mesh), "mesh") else torch.as_tensor(mesh)
    where = (grid == rank).nonzero()
    if where.shape[0] != 1:
        raise ShardMergeError(f"rank {rank} is not in the mesh {grid.tolist()}")
    return tuple(int(i) for i in where[0])


def global_indices(shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements, coordinate: tuple[int, ...]) -> torch.Tensor:
    """Flat indices into a tensor of ``shape`` of the elements the rank at ``coordinate`` holds, in its local order."""
    numel = 1
    for s in shape:
        numel *= int(s)
    local = torch.arange(numel, dtype=torch.int64).view(shape)
    for size, placement, index in zip(mesh_shape, placements, coordinate):
        if _is_cut(placement):
            chunks, _ = placement._split_tensor(local, int(size), with_padding=False)
            local = chunks[index] if index < len(chunks) else local.narrow(placement.dim, 0, 0)
        elif not placement.is_replicate():
            raise ShardMergeError(f"placement {placement} cannot be merged (only Shard / Replicate pieces are saved)")
    return local.reshape(-1)


def _is_cut(placement) -> bool:
    """``Shard`` or FSDP2's ``_StridedShard`` (which does not call itself a shard)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(placement, (Shard, _StridedShard))


def merge_pieces(pieces: dict[int, Any]) -> torch.Tensor:
    """The full CPU tensor from ``{rank: piece}`` (``DTensor`` pieces of every rank of its mesh, or plain tensors:
    one whole copy each, rank 0's is taken)."""
    first = next(iter(pieces.values()))
    if not hasattr(first, "placements"):
        return first.detach().cpu()
    mesh = first.device_mesh
    shape = tuple(first.shape)
    full = torch.empty(shape, dtype=first.dtype)
    flat = full.view(-1)
    filled = torch.zeros(flat.numel(), dtype=torch.bool)
    for rank, piece in pieces.items():
        idx = global_indices(shape, tuple(mesh.shape), piece.placements, rank_coordinate(piece.device_mesh, int(rank)))
        local = piece._local_tensor.detach().cpu().reshape(-1)
        if local.numel() != idx.numel():
            raise ShardMergeError(f"rank {rank}'s piece has {local.numel()} elements, its layout says {idx.numel()}")
        flat[idx] = local
        filled[idx] = True
    if not bool(filled.all()):
        raise ShardMergeError(f"{int((~filled).sum())} of {flat.numel()} elements of a {shape} tensor are in no piece "
                              "(a rank's file is missing)")
    return full


def merge_state_dicts(states: dict[int, dict[str, Any]], keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Full tensors of ``{rank: state dict}`` (nested dicts such as an optimizer's ``state`` are merged alike;
    non-tensor leaves are taken from the lowest rank).  A key held by some ranks only -- the parameters of one
    pipeline stage -- is merged from those ranks; an optimizer's ``param_groups`` list every rank's parameters."""
    ranks = sorted(states)
    if keys is None:
        keys = list(dict.fromkeys(k for r in ranks for k in states[r]))
    out: dict[str, Any] = {}
    for key in keys:
        values = {r: states[r][key] for r in ranks if key in states[r]}
        first = next(iter(values.values()))
        if isinstance(first, dict):
            out[key] = merge_state_dicts(values)
        elif isinstance(first, torch.Tensor):
            out[key] = merge_pieces(values)
        elif key == "param_groups" and isinstance(first, list):
            out[key] = _merged_param_groups(list(values.values()))
        else:
            out[key] = first
    return out


def _merged_param_groups(per_rank: list[list[dict]]) -> list[dict]:
    """Every rank's parameter names in each group (pipeline stages hold different parameters)."""
    groups = [dict(g) for g in per_rank[0]]
    for i, group in enumerate(groups):
        names = [n for rank_groups in per_rank if i < len(rank_groups) for n in rank_groups[i].get("params", [])]
        if all(isinstance(n, str) for n in names):
            group["params"] = list(dict.fromkeys(names))
    return groups
