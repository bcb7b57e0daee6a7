"""Where the SFT trainer runs: the device (``trainer.device``) and its data-parallel processes.

``trainer.n_gpus_per_node`` x ``trainer.nnodes`` is the number of data-parallel ranks (FSDP2 shards the model
over them, gloo on CPU and NCCL on GPU). Started by ``torchrun`` (``WORLD_SIZE`` in the environment), the
process joins that group (the two keys, when set, must match its size; verl's scripts set neither). Started
plainly with more than one rank on one node, the ranks are spawned here (``torch.multiprocessing``) on a free
local port. More than one node needs torchrun on each node, as with verl.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any, Callable

from hybridflow.controller.worker import ENV_LOCAL_RANKS

__all__ = ["run_ranks", "select_device", "world_size"]


def select_device(device: str) -> None:
    """Make ``trainer.device`` the engine's device (``auto``: a GPU when torch sees one)."""
    import torch

    from hybridflow.engine import device as dev

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but torch sees no GPU; use trainer.device=cpu (or auto)")
    if device in ("cpu", "cuda"):
        os.environ["HYBRIDFLOW_DEVICE"] = device
    dev.device_type.cache_clear()


def _parent_store(timeout_s: float = 600.0):
    """The rendezvous store of spawned ranks, held by the parent: its socket is bound (port 0, loopback) before
    any rank starts, so no other process can take the port between choosing it and listening on it."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = int(sock.getsockname()[1])
    return dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                         master_listen_fd=sock.detach())


def _join_group(timeout_s: float = 600.0) -> None:
    import torch
    import torch.distributed as dist

    from hybridflow.engine import device as dev

    if dev.is_cuda():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=dev.dist_backend(), timeout=timedelta(seconds=timeout_s))


def _spawned_rank(rank: int, fn: Callable[[Any], Any], config: Any, world: int, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from hybridflow.engine import device as dev

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)})
    os.environ.pop(ENV_LOCAL_RANKS, None)  # these ranks are launched: the parent's local-backend marker is not theirs
    if dev.is_cuda():
        torch.cuda.set_device(rank)
    timeout = timedelta(seconds=600)
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timeout)
    dist.init_process_group(backend=dev.dist_backend(), store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        out = fn(config)
        if rank == 0:
            results.put(out)
    finally:
        dist.destroy_process_group()


def world_size(config: Any, environ: dict | None = None) -> tuple[int, bool]:
    """``(ranks, started by a launcher)``: torchrun's ``WORLD_SIZE`` when it started us (the config's
    ``n_gpus_per_node`` x ``nnodes``, when set, must agree), else their product (unset counts as 1)."""
    env = os.environ if environ is None else environ
    t = config.trainer
    configured = None if t.n_gpus_per_node is None and t.nnodes is None else (t.n_gpus_per_node or 1) * (t.nnodes or 1)
    # a local-backend run earlier in this process wrote RANK/WORLD_SIZE for itself: no launcher started us (a
    # process started from that one inherits the marker, not the pid in it: torchrun's children are launched)
    if "WORLD_SIZE" in env and "RANK" in env and env.get(ENV_LOCAL_RANKS) != str(os.getpid()):
        launched = int(env["WORLD_SIZE"])
        if configured is not None and configured != launched:
            raise ValueError(f"the launcher started {launched} processes but trainer.n_gpus_per_node x trainer.nnodes "
                             f"= {t.n_gpus_per_node or 1} x {t.nnodes or 1} = {configured}; make them agree (torchrun "
                             "--nproc_per_node=N --nnodes=M with trainer.n_gpus_per_node=N trainer.nnodes=M) or drop "
                             "the two keys")
        return launched, True
    if (t.nnodes or 1) > 1:
        raise ValueError(f"trainer.nnodes={t.nnodes}: start the run on every node with torchrun --nnodes={t.nnodes} "
                         f"--nproc_per_node={t.n_gpus_per_node or 1} -m hybridflow.trainer.fsdp_sft_trainer ... "
                         "(a plain start spawns processes on this node only)")
    return configured or 1, False


def run_ranks(fn: Callable[[Any], Any], config: Any) -> Any:
    """``fn(config)`` on every rank of ``trainer.n_gpus_per_node`` x ``trainer.nnodes``; rank 0's result."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    world, launched = world_size(config)
    if launched:
        if not dist.is_initialized():
            _join_group()
        return fn(config)
    if world == 1:
        return fn(config)
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    store = _parent_store()
    mp.start_processes(_spawned_rank, args=(fn, config, world, store.port, results), nprocs=world, join=True,
                       start_method="spawn")
    del store
    return results.get() if not results.empty() else None
