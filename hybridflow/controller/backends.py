"""Backend selection: ``trainer.backend=local|ray`` picks how worker groups are built.

The trainer calls ``create_resource_pool(backend, ...)`` and ``create_worker_group(backend, pool,
cls_with_init)`` and never mentions Ray or the local backend by name, so the same trainer code runs
in one debuggable process (``local``: every group is the controller process itself, world size 1) or
on a Ray cluster (``ray``). New backends register with ``WORKER_GROUP_BACKENDS.register(name, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hybridflow.controller.local_backend import LocalResourcePool, LocalWorkerGroup
from hybridflow.controller.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup
from hybridflow.utils.registry import Registry

__all__ = ["Backend", "WORKER_GROUP_BACKENDS", "create_resource_pool", "create_worker_group"]


@dataclass(frozen=True)
class Backend:
    """How one backend makes pools and groups."""

    make_pool: Callable[..., ResourcePool]
    make_group: Callable[..., WorkerGroup]


def _local_pool(process_on_nodes: list[int], use_gpu: bool = False, **_unused) -> ResourcePool:
    if sum(process_on_nodes) != 1:
        raise ValueError(
            f"trainer.backend=local runs every role in this process (world size 1), but {sum(process_on_nodes)} "
            f"workers were asked for (process_on_nodes={process_on_nodes}); set trainer.nnodes=1 and "
            "trainer.n_gpus_per_node=1, or use trainer.backend=ray"
        )
    return LocalResourcePool(use_gpu=use_gpu)


def _ray_pool(process_on_nodes: list[int], use_gpu: bool = False, **kwargs) -> ResourcePool:
    from hybridflow.controller.ray_resources import RayResourcePool

    return RayResourcePool(process_on_nodes, use_gpu=use_gpu, **kwargs)


def _ray_group(resource_pool, cls_with_init, **kwargs) -> WorkerGroup:
    from hybridflow.controller.ray_worker_group import RayWorkerGroup

    return RayWorkerGroup(resource_pool, cls_with_init, **kwargs)


WORKER_GROUP_BACKENDS: Registry[Backend] = Registry("worker-group backend (trainer.backend)")
WORKER_GROUP_BACKENDS.register("local", Backend(_local_pool, LocalWorkerGroup))
WORKER_GROUP_BACKENDS.register("ray", Backend(_ray_pool, _ray_group))


def create_resource_pool(backend: str, process_on_nodes: list[int], use_gpu: bool = False, **kwargs) -> ResourcePool:
    """A pool for ``backend``; ``kwargs`` go to ``RayResourcePool`` (max_colocate_count, num_cpus_per_worker...)."""
    return WORKER_GROUP_BACKENDS.get(backend).make_pool(process_on_nodes, use_gpu=use_gpu, **kwargs)


def create_worker_group(
    backend: str, resource_pool: ResourcePool, cls_with_init: ClassWithInitArgs, role: str | None = None, **kwargs
) -> WorkerGroup:
    """A worker group of ``cls_with_init`` on ``resource_pool`` with the ``local`` or ``ray`` backend."""
    return WORKER_GROUP_BACKENDS.get(backend).make_group(resource_pool, cls_with_init, role=role, **kwargs)
