"""The ``Worker`` base class: one SPMD rank of a worker group.

A worker learns its place the way a ``torchrun`` process does -- from ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in its environment, which the
worker group sets per process -- so model code written for torchrun runs unchanged inside it. Built
without a group (a plain Python instantiation, or the local backend) it is rank 0 of a world of 1.

``torch.distributed`` is set up lazily by :meth:`Worker.init_distributed` (idempotent; also called by
:meth:`Worker.get_device_mesh`): creating the group must not block on a collective, because rank 0 is
created first to choose the rendezvous port that the other ranks are then given.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch

from hybridflow.utils.quiet import quiet_libraries
from hybridflow.utils.rendezvous_bind import free_port, pin_gloo_interface, rendezvous_host, tcp_store

__all__ = ["Worker", "ENV_DEVICE", "ENV_NUM_THREADS", "ENV_ROLE", "find_free_port", "node_ip_address"]

ENV_DEVICE = "HYBRIDFLOW_DEVICE"  # "cpu" or "cuda", set by the worker group from the resource pool
# The pid of the process whose RANK/WORLD_SIZE the local backend wrote (rank 0 of 1), not a launcher: a child
# process inherits the variables (and torchrun's children get their own RANK/WORLD_SIZE), never the pid
ENV_LOCAL_RANKS = "HYBRIDFLOW_LOCAL_RANKS"
ENV_NUM_THREADS = "HYBRIDFLOW_NUM_THREADS"  # torch intra-op threads = CPUs reserved for this process
ENV_ROLE = "HYBRIDFLOW_ROLE"  # worker-group name, for logs


def find_free_port() -> int:
    return free_port(rendezvous_host())


def node_ip_address() -> str:
    """Where rank 0's rendezvous listens: the loopback on one machine, this node's IP in a multi-node Ray cluster
    (``hybridflow.utils.rendezvous_bind``)."""
    return rendezvous_host()


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from None


class Worker:
    """Base class of every role worker; subclasses add ``@register``-ed methods.

    Subclasses call ``super().__init__()`` first. Colocated roles in one process each get their own
    ``Worker`` object (separate state) but share the process, its environment and its process group.
    """

    def __init__(self) -> None:
        self._rank = _env_int("RANK", 0)
        self._world_size = _env_int("WORLD_SIZE", 1)
        self._local_rank = _env_int("LOCAL_RANK", 0)
        self._local_world_size = _env_int("LOCAL_WORLD_SIZE", 1)
        if not 0 <= self._rank < self._world_size:
            raise ValueError(f"RANK={self._rank} is outside WORLD_SIZE={self._world_size}")
        quiet_libraries()
        threads = _env_int(ENV_NUM_THREADS, 0)
        if threads > 0:
            torch.set_num_threads(threads)
        if self._rank == 0 and not os.environ.get("MASTER_PORT"):
            # Rank 0 owns the rendezvous; the env is the single source of truth so colocated roles
            # (and torch's env:// init) agree on it.
            os.environ["MASTER_ADDR"] = node_ip_address()
            os.environ["MASTER_PORT"] = str(find_free_port())
        self._device = self._select_device()
        self._dispatch_info: dict[str, tuple[int, bool]] = {}

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    @property
    def device(self) -> torch.device:
        return self._device

    def _select_device(self) -> torch.device:
        wanted = os.environ.get(ENV_DEVICE) or ("cuda" if torch.cuda.is_available() else "cpu")
        if wanted == "cpu":
            return torch.device("cpu")
        if wanted != "cuda":
            raise ValueError(f"{ENV_DEVICE}={wanted!r}: expected 'cpu' or 'cuda'")
        if not torch.cuda.is_available():
            raise RuntimeError(f"rank {self._rank} was placed on a GPU bundle but torch sees no CUDA device")
        # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU, so index 0 is "my GPU"; under plain
        # torchrun every GPU of the node is visible and the local rank picks one.
        count = torch.cuda.device_count()
        return torch.device("cuda", 0 if count == 1 else self._local_rank % count)

    def _get_master_addr_port(self) -> tuple[str, str]:
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port:
            raise RuntimeError(
                f"rank {self._rank} has no rendezvous address (MASTER_ADDR/MASTER_PORT); start workers "
                "through a worker group, or set both variables as torchrun does"
            )
        return addr, port

    def _set_master_addr_port(self, addr: str, port: str) -> None:
        """Told by the worker group once rank 0 has chosen the rendezvous (colocated roles read the env)."""
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = str(addr), str(port)

    def _get_process_info(self) -> dict:
        """Where this rank runs (pid, node), for placement checks and error reports."""
        node_id = None
        import sys

        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                node_id = ray.get_runtime_context().get_node_id()
        return {"pid": os.getpid(), "node_id": node_id, "rank": self._rank, "local_rank": self._local_rank}

    # ------------------------------------------------------------------ torch.distributed
    def init_distributed(self, timeout_s: float = 600.0) -> None:
        """Join this group's process group (gloo on CPU; NCCL for CUDA tensors plus gloo for CPU ones)."""
        import torch.distributed as dist

        if dist.is_initialized():
            if dist.get_world_size() != self._world_size:
                raise RuntimeError(
                    f"a process group of size {dist.get_world_size()} already exists in this process, "
                    f"but this worker expects WORLD_SIZE={self._world_size}"
                )
            return
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
            backend = "cpu:gloo,cuda:nccl"
        else:
            backend = "gloo"
        addr, port = self._get_master_addr_port()
        pin_gloo_interface(addr)
        timeout = timedelta(seconds=timeout_s)
        # rank 0's store listens on the rendezvous address only (torch's own would listen on every interface)
        store = tcp_store(addr, int(port), self._world_size, self._rank == 0, timeout)
        dist.init_process_group(backend=backend, store=store, rank=self._rank, world_size=self._world_size,
                                timeout=timeout)

    def get_device_mesh(self, mesh_dim_names: tuple[str, ...], mesh_shape: tuple[int, ...]):
        """A ``DeviceMesh`` over this group, e.g. ``get_device_mesh(("dp", "sp"), (2, 1))``.

        The product of ``mesh_shape`` must equal the world size; the last dimension varies fastest,
        so ranks sharing a ``dp`` index are adjacent (as FSDP/TP/SP expect).
        """
        from torch.distributed.device_mesh import init_device_mesh

        if len(mesh_dim_names) != len(mesh_shape):
            raise ValueError(f"get_device_mesh: {len(mesh_dim_names)} names {mesh_dim_names} for shape {mesh_shape}")
        total = 1
        for s in mesh_shape:
            total *= int(s)
        if total != self._world_size:
            raise ValueError(
                f"get_device_mesh: shape {tuple(mesh_shape)} ({'x'.join(map(str, mesh_shape))}={total}) must "
                f"multiply to the world size {self._world_size}"
            )
        self.init_distributed()
        return init_device_mesh(self._device.type, tuple(mesh_shape), mesh_dim_names=tuple(mesh_dim_names))

    # ------------------------------------------------------------------ N-D dispatch membership
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel index and whether its output is collected, for ``mesh_name``."""
        if mesh_name in self._dispatch_info:
            raise ValueError(f"rank {self._rank} already declared its place in mesh '{mesh_name}'")
        self._dispatch_info[mesh_name] = (int(dp_rank), bool(is_collect))

    def _query_dispatch_info(self, mesh_name: str) -> tuple[int, bool]:
        try:
            return self._dispatch_info[mesh_name]
        except KeyError:
            known = sorted(self._dispatch_info) or ["none"]
            raise KeyError(
                f"{type(self).__name__} rank {self._rank} never declared mesh '{mesh_name}' (declared: "
                f"{', '.join(known)}); call self._register_dispatch_collect_info('{mesh_name}', dp_rank=..., "
                "is_collect=...) in __init__"
            ) from None
