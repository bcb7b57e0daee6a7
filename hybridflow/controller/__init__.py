"""The HybridFlow core: workers, transfer protocols, worker groups and resource pools (Ray and local).

Nothing here knows about RL. A role is a :class:`Worker` subclass whose methods carry
``@register(dispatch_mode=...)``; a worker group built from it (``RayWorkerGroup`` or
``LocalWorkerGroup``, see :func:`create_worker_group`) exposes those methods to the single controller.
Ray is imported only when the Ray backend is used.
"""

from hybridflow.controller.colocate import ColocatedWorker, create_colocated_worker_cls
from hybridflow.controller.decorator import (
    Dispatch,
    DispatchMode,
    DispatchPlan,
    Execute,
    get_dispatch_mode,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
)
from hybridflow.controller.errors import (
    ControllerError,
    NodeLostError,
    RayInitError,
    ResourceUnavailableError,
    WorkerDiedError,
    WorkerError,
)
from hybridflow.controller.backends import WORKER_GROUP_BACKENDS, create_resource_pool, create_worker_group
from hybridflow.controller.local_backend import LocalResourcePool, LocalWorkerGroup
from hybridflow.controller.worker import Worker
from hybridflow.controller.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

_RAY_NAMES = {
    "RayResourcePool": "hybridflow.controller.ray_resources",
    "init_ray": "hybridflow.controller.ray_init",
    "RayClassWithInitArgs": "hybridflow.controller.ray_worker_group",
    "RayWorkerGroup": "hybridflow.controller.ray_worker_group",
}


def __getattr__(name: str):
    """Ray-backed names load lazily: importing the controller must not cost Ray's import time."""
    if name in _RAY_NAMES:
        import importlib

        return getattr(importlib.import_module(_RAY_NAMES[name]), name)
    raise AttributeError(f"module 'hybridflow.controller' has no attribute '{name}'")


__all__ = [
    "ClassWithInitArgs",
    "ColocatedWorker",
    "ControllerError",
    "Dispatch",
    "DispatchMode",
    "DispatchPlan",
    "Execute",
    "LocalResourcePool",
    "LocalWorkerGroup",
    "NodeLostError",
    "RayClassWithInitArgs",
    "RayInitError",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePool",
    "ResourceUnavailableError",
    "WORKER_GROUP_BACKENDS",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "create_colocated_worker_cls",
    "create_resource_pool",
    "create_worker_group",
    "get_dispatch_mode",
    "init_ray",
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
]
