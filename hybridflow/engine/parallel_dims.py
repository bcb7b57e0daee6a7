"""``ParallelDims``: how one role's ranks are laid out, and the ``DeviceMesh`` built from that layout.

A training role (actor, reference, critic, reward model) runs on ``world`` ranks arranged as a named mesh whose
dimensions say what they split::

    world = dp x sp          (later: x tp x ep)

* ``dp`` -- data parallel: each dp index gets its own rows of the batch; FSDP2 shards the parameters over
  every rank that holds the same parameters (today all of them: dp x sp).
* ``sp`` -- Ulysses sequence parallel: the ranks of one sp group hold the *same* rows, each a slice of the
  token axis, and swap sequence shards for head shards around attention (``engine/ulysses.py``).

Ranks are laid out row-major with the last dimension fastest (rank = dp_index * sp + sp_index), the layout
``init_device_mesh`` uses, so the ranks of one sp group are adjacent (on one node when sp <= GPUs per node).

Everything a worker needs to know about the layout comes from here, so a new dimension (``tp``, ``ep``) is added
to this class without touching the worker code:

* which rows a rank gets -- :meth:`dp_rank` (ranks with the same dp index get the same chunk of the batch);
* whose outputs the controller collects -- :meth:`is_collect` (index 0 on every non-dp dimension);
* the loss normaliser's data-parallel world -- :attr:`dp`;
* the process groups -- :meth:`build` creates the mesh and exposes ``dp_group`` / ``sp_group`` and the FSDP mesh.

The arithmetic part (sizes, coordinates, validation) needs no process group, so workers can declare their place
for the controller's dispatch in ``__init__``, before ``torch.distributed`` is joined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

__all__ = ["ParallelDims", "ParallelDimsError"]


class ParallelDimsError(ValueError):
    """A layout that cannot be built (the message names the config key and the fix)."""


@dataclass
class ParallelDims:
    """Sizes of the named mesh dimensions of one role over ``world`` ranks.

    ``sp`` comes from ``<role>.ulysses_sequence_parallel_size``; ``dp`` is what is left (``world / sp``).
    ``key`` is the config key named in errors.
    """

    world: int
    sp: int = 1
    key: str = "ulysses_sequence_parallel_size"
    _mesh: Any = field(default=None, init=False, repr=False)
    _fsdp_mesh: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.world, self.sp = int(self.world), int(self.sp)
        if self.world < 1:
            raise ParallelDimsError(f"a worker group needs at least one rank, got world size {self.world}")
        if self.sp < 1:
            raise ParallelDimsError(f"{self.key}={self.sp}: must be >= 1 (1 turns sequence parallelism off)")
        if self.world % self.sp:
            raise ParallelDimsError(
                f"{self.key}={self.sp} must divide the {self.world} ranks of the group (world = dp x sp); "
                f"choose a divisor of {self.world} or change trainer.n_gpus_per_node x trainer.nnodes")

    # ------------------------------------------------------------------ sizes and coordinates (no process group)
    @property
    def dp(self) -> int:
        """Data-parallel size: how many different chunks of the batch the group processes at once."""
        return self.world // self.sp

    @property
    def names(self) -> tuple[str, ...]:
        return ("dp", "sp")

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.dp, self.sp)

    @property
    def sp_enabled(self) -> bool:
        return self.sp > 1

    def coordinate(self, rank: int) -> dict[str, int]:
        """``{"dp": i, "sp": j}`` of global ``rank`` (row-major, last dimension fastest)."""
        if not 0 <= rank < self.world:
            raise ParallelDimsError(f"rank {rank} is outside a group of {self.world} ranks")
        coords, rest = {}, rank
        for name, size in reversed(list(zip(self.names, self.shape))):
            coords[name] = rest % size
            rest //= size
        return {name: coords[name] for name in self.names}

    def dp_rank(self, rank: int) -> int:
        """Which chunk of a data-parallel batch ``rank`` processes (shared by its sp peers)."""
        return self.coordinate(rank)["dp"]

    def is_collect(self, rank: int) -> bool:
        """Whether the controller collects ``rank``'s outputs: one rank per dp index (0 on every other dim)."""
        return all(v == 0 for k, v in self.coordinate(rank).items() if k != "dp")

    def sp_peers(self, rank: int) -> list[int]:
        """Global ranks of ``rank``'s sequence-parallel group, in sp order."""
        base = self.dp_rank(rank) * self.sp
        return list(range(base, base + self.sp))

    # ------------------------------------------------------------------ process groups
    def build(self, device_type: str) -> "ParallelDims":
        """Create the named ``DeviceMesh`` (a collective: every rank of the group calls it, in the same order).

        No-op without ``torch.distributed`` or with one rank (the local backend): there is nothing to split.
        """
        if self._mesh is not None or not _distributed() or self.world == 1:
            return self
        if dist.get_world_size() != self.world:
            raise ParallelDimsError(
                f"the process group has {dist.get_world_size()} ranks but the layout was planned for {self.world}")
        from torch.distributed.device_mesh import init_device_mesh

        self._mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=self.names)
        return self

    @property
    def mesh(self):
        """The named ``DeviceMesh`` (``None`` before :meth:`build` or on a single rank)."""
        return self._mesh

    def _group(self, name: str):
        if self._mesh is None:
            return None
        return self._mesh[name].get_group()

    @property
    def dp_group(self):
        """Process group of the data-parallel peers (same sp index); ``None`` = the default group or no group."""
        return self._group("dp") if self.sp > 1 else None

    @property
    def sp_group(self):
        """Process group of this rank's sequence-parallel peers; ``None`` when sp = 1."""
        return self._group("sp") if self.sp > 1 else None

    def fsdp_mesh(self, device_type: str, fsdp_size: int | None = -1):
        """The mesh FSDP2 shards over: every rank holding the same parameters (dp x sp), ``("fsdp",)``, or
        ``("ddp", "fsdp")`` (HSDP: replicate across groups of ``fsdp_size``) when ``fsdp_size`` divides the world.

        ``None`` on a single rank (the local backend keeps a plain module).  Sharding runs over the flattened
        dp x sp ranks because sp peers hold identical parameters: gradients from their token slices are
        reduced together with those of the data-parallel peers.
        """
        if self._fsdp_mesh is not None or not _distributed() or self.world == 1:
            return self._fsdp_mesh
        from torch.distributed.device_mesh import init_device_mesh

        # Only data dimensions exist today, so "dp x sp flattened" is the whole world in rank order.
        world = self.world
        if fsdp_size in (-1, 0, None) or fsdp_size >= world:
            self._fsdp_mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("fsdp",))
        elif world % int(fsdp_size):
            raise ParallelDimsError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size {world} (or be -1)")
        else:
            self._fsdp_mesh = init_device_mesh(device_type, (world // int(fsdp_size), int(fsdp_size)),
                                               mesh_dim_names=("ddp", "fsdp"))
        return self._fsdp_mesh

    def describe(self) -> str:
        return " x ".join(f"{n}={s}" for n, s in zip(self.names, self.shape))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
