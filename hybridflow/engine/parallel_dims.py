"""``ParallelDims``: how one role's ranks are laid out, and the ``DeviceMesh`` built from that layout.

A training role (actor, reference, critic, reward model) runs on ``world`` ranks arranged as a named mesh whose
dimensions say what they split::

    world = pp x dp x sp x tp          with dp = edp x ep

* ``pp`` -- pipeline parallel: each pp index holds a different run of decoder layers (one stage, or ``vpp``
  virtual stages interleaved over the pp ranks) and passes activations to the next (``engine/parallel/
  pipeline.py``); the pp peers of a (dp, sp, tp) coordinate hold the same rows. Outermost, as Megatron and
  torchtitan lay it out: stages are the furthest apart (across nodes), tp the closest.

* ``dp`` -- data parallel: each dp index gets its own rows of the batch.
* ``sp`` -- Ulysses sequence parallel: the ranks of one sp group hold the *same* rows, each a slice of the
  token axis, and swap sequence shards for head shards around attention (``engine/ulysses.py``).
* ``tp`` -- tensor parallel: the ranks of one tp group hold the same rows and split every layer's weights
  (attention heads, MLP columns/rows, the vocabulary of the embedding and the LM head;
  ``engine/tensor_parallel.py``).
* ``ep`` -- expert parallel, a sub-dimension of dp (as Megatron carves it out of the data-parallel ranks): the
  ``ep`` consecutive dp indices of one ep group hold different rows and split the experts of every MoE layer
  between them; tokens travel to their experts' rank and back with all-to-all (``engine/expert_parallel.py``).
  ``edp = dp / ep`` is what is left of data parallelism for the expert weights.
  When ep does not divide dp, an expert group may also take in whole sp x tp blocks, as Megatron's expert groups
  over dp x cp x tp do (``expert_tensor_parallel_size = 1``): ``ep = ep_dp x sp x tp`` with ``ep_dp`` dividing
  dp (``ep_beyond_dp``; then ``edp = dp / ep_dp``).  The sp ranks hold different tokens already; the tp ranks of
  a group hold the same tokens, so in a MoE layer each dispatches its 1/tp of them and the outputs are gathered
  over tp again.  Or, when ep divides tp, the groups lie inside the tp groups, ep adjacent tp ranks each
  (``ep_in_tp``: Megatron's layout for verl's Qwen3-30B line, tp 4 x ep 2 with dp 1): the tp index is
  ``etp_index x ep + ep_index``, every rank still dispatches its 1/tp of the tokens within its group of ep, and the
  expert weights are replicated over dp x sp x tp / ep ranks.

Ranks are laid out row-major with the last dimension fastest::

    rank = (((pp_index * edp + edp_index) * ep + ep_index) * sp + sp_index) * tp + tp_index,
    dp_index = edp_index * ep + ep_index

the layout ``init_device_mesh`` uses, so a tp group is adjacent ranks (one node when tp <= GPUs per node), then
an sp group.  FSDP2 shards what is left over the ranks that hold the same parameters:

* dense parameters -- over every (dp, sp) rank of a tp index: the ``fsdp`` dimension (edp x ep x sp flattened),
  on top of the tp split;
* expert weights -- over the ``efsdp`` dimension (edp x sp x tp flattened; edp alone when the expert groups reach
  beyond dp) on top of the ep split (experts are never split by tp: ``expert_tensor_parallel_size = 1``).

Everything a worker needs to know about the layout comes from here, so a dimension is added to this class without
touching the worker code:

* which rows a rank gets -- :meth:`dp_rank` (ranks with the same dp index get the same chunk of the batch);
* whose outputs the controller collects -- :meth:`is_collect` (index 0 on every dimension but dp, and the last
  pipeline stage, which computes the outputs);
* the loss normaliser's data-parallel world -- :attr:`dp` and :attr:`dp_group`;
* the process groups -- :meth:`build` creates the mesh; ``sp_group``, ``tp_mesh``, ``ep_mesh`` and the FSDP
  meshes come from it.

The arithmetic part (sizes, coordinates, validation) needs no process group, so workers can declare their place
for the controller's dispatch in ``__init__``, before ``torch.distributed`` is joined.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

__all__ = ["ParallelDims", "ParallelDimsError", "role_layout"]


class ParallelDimsError(ValueError):
    """A layout that cannot be built (the message names the config key and the fix)."""


@dataclass
class ParallelDims:
    """Sizes of the named mesh dimensions of one role over ``world`` ranks.

    ``sp`` comes from ``<role>.ulysses_sequence_parallel_size`` (or Megatron's ``context_parallel_size``),
    ``tp`` / ``ep`` from ``<role>.megatron.tensor_model_parallel_size`` / ``expert_model_parallel_size``;
    ``dp`` is what is left (``world / (pp x sp x tp)``).  ``key`` / ``tp_key`` / ``ep_key`` are the config keys named
    in errors.
    """

    world: int
    sp: int = 1
    tp: int = 1
    ep: int = 1
    pp: int = 1
    vpp: int = 1
    tp_sp: bool = False  # Megatron's sequence parallelism inside the tp group (megatron.sequence_parallel, tp > 1)
    key: str = "ulysses_sequence_parallel_size"
    tp_key: str = "megatron.tensor_model_parallel_size"
    ep_key: str = "megatron.expert_model_parallel_size"
    pp_key: str = "megatron.pipeline_model_parallel_size"
    _mesh: Any = field(default=None, init=False, repr=False)
    _fsdp_mesh: Any = field(default=None, init=False, repr=False)
    _meshes: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.world, self.sp, self.tp, self.ep = int(self.world), int(self.sp), int(self.tp), int(self.ep)
        self.tp_sp = bool(self.tp_sp) and self.tp > 1
        self.pp, self.vpp = int(self.pp), int(self.vpp)
        if self.world < 1:
            raise ParallelDimsError(f"a worker group needs at least one rank, got world size {self.world}")
        for key, size, what in ((self.key, self.sp, "sequence"), (self.tp_key, self.tp, "tensor"),
                                (self.ep_key, self.ep, "expert"), (self.pp_key, self.pp, "pipeline")):
            if size < 1:
                raise ParallelDimsError(f"{key}={size}: must be >= 1 (1 turns {what} parallelism off)")
        if self.vpp < 1:
            raise ParallelDimsError(f"virtual_pipeline_model_parallel_size={self.vpp}: must be >= 1 (or null)")
        if self.world % (self.pp * self.sp * self.tp):
            raise ParallelDimsError(
                f"{self.pp_key}={self.pp} x {self.key}={self.sp} x {self.tp_key}={self.tp} must divide the "
                f"{self.world} ranks of the group (world = pp x dp x sp x tp); choose sizes whose product divides "
                f"{self.world} or change trainer.n_gpus_per_node x trainer.nnodes")
        if self.dp % self.ep and not self._ep_can_reach_beyond_dp():
            raise ParallelDimsError(self._ep_refusal())

    def _ep_can_reach_beyond_dp(self) -> bool:
        """Whether expert groups can take in the sp and tp ranks (Megatron's expert groups over dp x cp x tp):
        ep = k x sp x tp with k dividing dp."""
        return self._ep_over_whole_blocks() or (self.tp > 1 and self.tp % self.ep == 0)  # or inside the tp groups

    def _ep_over_whole_blocks(self) -> bool:
        inner = self.sp * self.tp
        return inner > 1 and self.ep % inner == 0 and self.dp % (self.ep // inner) == 0

    def _ep_refusal(self) -> str:
        sizes = (f"world / (pp x sp x tp) = {self.world} / ({self.pp} x {self.sp} x {self.tp})" if self.pp > 1
                 else f"world / (sp x tp) = {self.world} / ({self.sp} x {self.tp})")
        why = (f"{self.ep_key}={self.ep} must divide the data-parallel size dp = {sizes} = {self.dp} "
               "(expert groups inside the data-parallel ranks)")
        inner = self.sp * self.tp
        if inner == 1:
            return f"{why}; lower it or add ranks"
        return (f"{why}, or divide {self.tp_key}={self.tp} (expert groups inside the tensor-parallel groups), or be "
                f"a multiple k x {inner} of {self.key} x {self.tp_key} = {self.sp} x {self.tp} with k dividing dp "
                "(expert groups over whole dp x sp x tp blocks of ranks, as Megatron builds them over dp x cp x tp); "
                "lower it or add ranks")

    # ------------------------------------------------------------------ sizes and coordinates (no process group)
    @property
    def dp(self) -> int:
        """Data-parallel size: how many different chunks of the batch the group processes at once."""
        return self.world // (self.pp * self.sp * self.tp)

    @property
    def stage_world(self) -> int:
        """Ranks of one pipeline stage (dp x sp x tp): the world of every mesh but the pipeline's."""
        return self.world // self.pp

    @property
    def ep_beyond_dp(self) -> bool:
        """Whether the expert groups take in the sp and tp ranks (ep = ep_dp x sp x tp; chosen only when ep does not
        divide dp): the tp ranks of a group then split their (shared) tokens between them in the MoE layers."""
        return self.ep > 1 and self.dp % self.ep != 0

    @property
    def ep_in_tp(self) -> bool:
        """Whether the expert groups lie inside the tp groups (beyond dp, with ep dividing tp and smaller than it):
        ep adjacent tp ranks form a group."""
        return self.ep_beyond_dp and not self._ep_over_whole_blocks() and self.tp % self.ep == 0

    @property
    def ep_dp(self) -> int:
        """How many data-parallel indices one expert group spans (ep, ep / (sp x tp) beyond dp, 1 inside tp)."""
        if self.ep_in_tp:
            return 1
        return self.ep // (self.sp * self.tp) if self.ep_beyond_dp else self.ep

    @property
    def edp(self) -> int:
        """Data parallelism left for the expert weights (dp / ep_dp)."""
        return self.dp // self.ep_dp

    @property
    def nd(self) -> bool:
        """Whether tensor, expert or pipeline parallelism is on (the N-D engine); else the plain dp x sp layout."""
        return self.tp > 1 or self.ep > 1 or self.pp > 1

    @property
    def names(self) -> tuple[str, ...]:
        inner = ("dp", "sp", "tp") if self.tp > 1 else ("dp", "sp")
        return ("pp", *inner) if self.pp > 1 else inner

    @property
    def shape(self) -> tuple[int, ...]:
        inner = (self.dp, self.sp, self.tp) if self.tp > 1 else (self.dp, self.sp)
        return (self.pp, *inner) if self.pp > 1 else inner

    @property
    def sp_enabled(self) -> bool:
        return self.sp > 1

    def coordinate(self, rank: int) -> dict[str, int]:
        """``{"dp": i, "sp": j[, "tp": k]}`` of global ``rank`` (row-major, last dimension fastest)."""
        if not 0 <= rank < self.world:
            raise ParallelDimsError(f"rank {rank} is outside a group of {self.world} ranks")
        coords, rest = {}, rank
        for name, size in reversed(list(zip(self.names, self.shape))):
            coords[name] = rest % size
            rest //= size
        return {name: coords[name] for name in self.names}

    def full_coordinate(self, rank: int) -> dict[str, int]:
        """All six indices of ``rank``: pp, dp (= edp x ep + ep), edp, ep, sp, tp."""
        c = self.coordinate(rank)
        dp, tp = c["dp"], c.get("tp", 0)
        if self.ep_in_tp:
            ep = tp % self.ep
        elif self.ep_beyond_dp:
            ep = ((dp % self.ep_dp) * self.sp + c["sp"]) * self.tp + tp
        else:
            ep = dp % self.ep
        return {"pp": c.get("pp", 0), "dp": dp, "edp": dp // self.ep_dp, "ep": ep, "sp": c["sp"], "tp": tp}

    def dp_rank(self, rank: int) -> int:
        """Which chunk of a data-parallel batch ``rank`` processes (shared by its sp and tp peers)."""
        return self.coordinate(rank)["dp"]

    def is_collect(self, rank: int) -> bool:
        """Whether the controller collects ``rank``'s outputs: one rank per dp index -- 0 on sp and tp, and the last
        pipeline stage's rank, which computes the outputs and the update's metrics."""
        c = self.coordinate(rank)
        return c.get("pp", self.pp - 1) == self.pp - 1 and c["sp"] == 0 and c.get("tp", 0) == 0

    def pp_rank(self, rank: int) -> int:
        """Which pipeline rank ``rank`` is (0 without pipeline parallelism)."""
        return self.coordinate(rank).get("pp", 0)

    def sp_peers(self, rank: int) -> list[int]:
        """Global ranks of ``rank``'s sequence-parallel group, in sp order."""
        c = self.full_coordinate(rank)
        base = c["pp"] * self.stage_world
        return [base + (c["dp"] * self.sp + s) * self.tp + c["tp"] for s in range(self.sp)]

    def tp_peers(self, rank: int) -> list[int]:
        """Global ranks of ``rank``'s tensor-parallel group, in tp order."""
        c = self.full_coordinate(rank)
        base = c["pp"] * self.stage_world
        return [base + (c["dp"] * self.sp + c["sp"]) * self.tp + t for t in range(self.tp)]

    def pp_peers(self, rank: int) -> list[int]:
        """Global ranks of ``rank``'s pipeline group, in stage order."""
        inner = rank % self.stage_world
        return [p * self.stage_world + inner for p in range(self.pp)]

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

        if not self.nd:
            self._mesh = init_device_mesh(device_type, self.shape, mesh_dim_names=self.names)
            return self
        # The N-D mesh: every dimension named, then the flattened views the engine uses.
        inner, names = self._nd_dimensions()
        mesh = init_device_mesh(device_type, ((self.pp,) + inner) if self.pp > 1 else inner,
                                mesh_dim_names=(("pp",) + names) if self.pp > 1 else names)
        self._mesh = mesh
        self._meshes = self._nd_views(mesh)
        if self.pp > 1:
            self._tied_group = self._first_last_groups()
        return self

    def _nd_dimensions(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """The N-D mesh's sizes and names inside a pipeline stage, by where the expert groups lie:

        * inside the tp groups (``ep_in_tp``): tp split into (etp, ep), ep fastest;
        * inside dp: ``edp x ep`` dp indices; over whole sp x tp blocks: ``edp x epd`` (``epd`` = ep_dp, the dp
          indices of a group, which also takes in their sp x tp ranks)."""
        if self.ep_in_tp:
            return (self.dp, self.sp, self.tp // self.ep, self.ep), ("dp", "sp", "etp", "ep")
        epd = "epd" if self.ep_beyond_dp else "ep"
        return (self.edp, self.ep_dp, self.sp, self.tp), ("edp", epd, "sp", "tp")

    def _nd_views(self, mesh) -> dict[str, Any]:
        """The flattened views of the N-D mesh: "dp", "fsdp" (dense parameters), "tp" (when tp is split into etp x
        ep), "ep" (when the expert groups span several dimensions) and "efsdp" (the ranks holding the same
        experts)."""
        if self.ep_in_tp:
            return {"fsdp": mesh["dp", "sp"]._flatten("fsdp"), "tp": mesh["etp", "ep"]._flatten("tp"),
                    "efsdp": mesh["dp", "sp", "etp"]._flatten("efsdp")}
        epd = "epd" if self.ep_beyond_dp else "ep"
        views = {"dp": mesh["edp", epd]._flatten("dp"), "fsdp": mesh["edp", epd, "sp"]._flatten("fsdp")}
        if self.ep_beyond_dp:
            views["ep"] = mesh[epd, "sp", "tp"]._flatten("ep")
            views["efsdp"] = mesh["edp"]
        else:
            views["efsdp"] = mesh["edp", "sp", "tp"]._flatten("efsdp")
        return views

    def _first_last_groups(self):
        """The group of this rank's first- and last-stage peers (a collective: every rank creates every pair, in the
        same order): tied input and output embeddings live on those two stages and sum their gradients there."""
        mine = None
        for inner in range(self.stage_world):
            pair = [inner, (self.pp - 1) * self.stage_world + inner]
            group = dist.new_group(pair)
            if dist.get_rank() in pair:
                mine = group
        return mine

    @property
    def pp_group(self):
        """Process group of this rank's pipeline peers (same dp, sp, tp index); ``None`` when pp = 1."""
        return self._group("pp") if self.pp > 1 else None

    @property
    def tied_embedding_group(self):
        """Process group of this rank's first- and last-stage peers; ``None`` when pp = 1 or on a middle stage."""
        return getattr(self, "_tied_group", None)

    @property
    def mesh(self):
        """The named ``DeviceMesh`` (``None`` before :meth:`build` or on a single rank)."""
        return self._mesh

    def _group(self, name: str):
        if self._mesh is None:
            return None
        if name in self._meshes:
            return self._meshes[name].get_group()
        return self._mesh[name].get_group()

    @property
    def dp_group(self):
        """Process group of the data-parallel peers (same pp, sp and tp index); ``None`` = the default group or no
        group (every rank is a data-parallel peer)."""
        if self.every_rank_a_dp_peer:
            return None
        return self._group("dp")

    @property
    def every_rank_a_dp_peer(self) -> bool:
        """Whether the data-parallel peers are the whole group: no pipeline, sequence or tensor dimension (the pp
        peers of a rank hold the same rows, so a sum over the world would count them pp times)."""
        return self.sp == 1 and self.tp == 1 and self.pp == 1

    @property
    def sp_group(self):
        """Process group of this rank's sequence-parallel peers; ``None`` when sp = 1."""
        return self._group("sp") if self.sp > 1 else None

    @property
    def tp_mesh(self):
        """1-D mesh of this rank's tensor-parallel peers; ``None`` when tp = 1 or unbuilt."""
        if self._mesh is None or self.tp == 1:
            return None
        return self._meshes["tp"] if "tp" in self._meshes else self._mesh["tp"]

    @property
    def ep_mesh(self):
        """1-D mesh of this rank's expert-parallel peers; ``None`` when ep = 1 or unbuilt."""
        if self._mesh is None or self.ep == 1:
            return None
        return self._meshes["ep"] if "ep" in self._meshes else self._mesh["ep"]

    @property
    def expert_token_split(self):
        """``(tp group, tp, tp index)`` when the expert groups span tp (the tp ranks hold the same tokens and each
        dispatches its slice of them), else ``None``."""
        if not self.ep_beyond_dp or self.tp == 1 or self._mesh is None:
            return None
        tp = self.tp_mesh
        return tp.get_group(), self.tp, tp.get_local_rank()

    @property
    def expert_fsdp_mesh(self):
        """The mesh FSDP2 shards expert weights over (edp x sp x tp flattened, or edp when the expert groups reach
        beyond dp); ``None`` unless ep > 1."""
        return self._meshes.get("efsdp") if self.ep > 1 else None

    def fsdp_mesh(self, device_type: str, fsdp_size: int | None = -1):
        """The mesh FSDP2 shards (dense) parameters over: every rank holding the same parameters, ``("fsdp",)``,
        or ``("ddp", "fsdp")`` (HSDP: replicate across groups of ``fsdp_size``) when ``fsdp_size`` divides it.

        ``None`` on a single rank (the local backend keeps a plain module).  Without tp / ep this is the whole
        world in rank order (sp peers hold identical parameters: gradients from their token slices are reduced
        together with those of the data-parallel peers); with tp it is the dp x sp ranks of one tp index.
        """
        if self._fsdp_mesh is not None or not _distributed() or self.world == 1:
            return self._fsdp_mesh
        from torch.distributed.device_mesh import init_device_mesh

        if self.nd:
            flat = self._meshes["fsdp"]
            size = flat.size()
            if fsdp_size in (-1, 0, None) or fsdp_size >= size:
                self._fsdp_mesh = flat
            elif size % int(fsdp_size):
                raise ParallelDimsError(f"fsdp_config.fsdp_size={fsdp_size} must divide the {size} ranks that hold the "
                                        "same parameters (dp x sp), or be -1")
            else:
                self._fsdp_mesh = flat._unflatten(0, (size // int(fsdp_size), int(fsdp_size)), ("ddp", "fsdp_shard"))
            return self._fsdp_mesh
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
        parts = [f"pp={self.pp}" + (f" (x{self.vpp} virtual stages)" if self.vpp > 1 else "")] if self.pp > 1 else []
        parts += [f"dp={self.dp}" + (f" (ep={self.ep})" if self.ep > 1 and not self.ep_beyond_dp else ""),
                  f"sp={self.sp}"]
        if self.tp > 1:
            parts.append(f"tp={self.tp}")
        text = " x ".join(parts)
        if self.ep_in_tp:
            return f"{text} (ep={self.ep} inside tp)"
        return f"{text} (ep={self.ep} over dp x sp x tp)" if self.ep_beyond_dp else text

    @classmethod
    def for_role(cls, world: int, node: Any, prefix: str) -> "ParallelDims":
        """The layout a role's config node asks for (``prefix``: the node's key, named in errors)."""
        return cls(world, key=f"{prefix}.ulysses_sequence_parallel_size",
                   tp_key=f"{prefix}.megatron.tensor_model_parallel_size",
                   ep_key=f"{prefix}.megatron.expert_model_parallel_size",
                   pp_key=f"{prefix}.megatron.pipeline_model_parallel_size", **role_layout(node))


def role_layout(node: Any) -> dict[str, int]:
    """``{"sp", "tp", "ep", "pp", "vpp"}`` of a role's config node: sp from ``ulysses_sequence_parallel_size`` (the
    megatron strategy copies ``context_parallel_size`` there at config time), tp / ep / pp / vpp and ``tp_sp``
    (``sequence_parallel``) from its ``megatron`` node when the role's ``strategy`` is ``megatron`` (1 otherwise)."""
    sp = int(getattr(node, "ulysses_sequence_parallel_size", 1) or 1)
    megatron = getattr(node, "megatron", None)
    if getattr(node, "strategy", None) != "megatron" or megatron is None:
        return {"sp": sp, "tp": 1, "ep": 1, "pp": 1, "vpp": 1}
    return {"sp": sp, "tp": int(megatron.tensor_model_parallel_size or 1),
            "tp_sp": bool(getattr(megatron, "sequence_parallel", False)),
            "ep": int(megatron.expert_model_parallel_size or 1),
            "pp": int(getattr(megatron, "pipeline_model_parallel_size", 1) or 1),
            "vpp": int(getattr(megatron, "virtual_pipeline_model_parallel_size", 1) or 1)}


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
