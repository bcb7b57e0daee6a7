"""The local backend: the worker runs in the controller's own process, as rank 0 of a world of 1.

Same worker classes, same ``@register`` methods, same call syntax and the same dispatch/collect code
as the Ray backend -- but no Ray, no pickling and no extra process, so ``breakpoint()`` inside a worker
method just works and tests start in milliseconds. Non-blocking calls run eagerly and return already
computed futures; exceptions are raised as ``WorkerError`` with the original as ``__cause__``.
"""

from __future__ import annotations

import os
import traceback
from typing import Iterable

from hybridflow.controller.decorator import DispatchPlan
from hybridflow.controller.errors import WorkerError
from hybridflow.controller.worker import ENV_DEVICE, ENV_LOCAL_RANKS
from hybridflow.controller.worker_group import CallInfo, ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = ["LocalResourcePool", "LocalWorkerGroup"]


class LocalResourcePool(ResourcePool):
    """The controller process as the one and only worker slot (``use_gpu``: run it on ``cuda``)."""

    def __init__(self, use_gpu: bool = False):
        super().__init__([1], use_gpu=use_gpu, max_colocate_count=1)

    def __repr__(self) -> str:
        return f"LocalResourcePool(use_gpu={self.use_gpu})"


class LocalWorkerGroup(WorkerGroup):
    """``LocalWorkerGroup(resource_pool, cls_with_init)``: one in-process worker, world size 1."""

    def __init__(self, resource_pool: ResourcePool, cls_with_init: ClassWithInitArgs, role: str | None = None):
        if resource_pool.world_size != 1:
            raise ValueError(
                f"the local backend runs one worker in this process, but the pool asks for "
                f"{resource_pool.world_size} (process_on_nodes={resource_pool.process_on_nodes}); "
                "use trainer.backend=ray for more ranks or a LocalResourcePool()"
            )
        super().__init__(role or cls_with_init.user_cls.__name__, cls_with_init.user_cls)
        self.resource_pool = resource_pool
        # torchrun-like env: the controller process is rank 0 of 1 (a stale MASTER_PORT is kept: it is ours).
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                           ENV_LOCAL_RANKS: str(os.getpid())})
        os.environ[ENV_DEVICE] = "cuda" if resource_pool.use_gpu else "cpu"
        info = CallInfo(self.role, self._worker_cls.__name__, "__init__", (0,))
        self._worker = self._guard(info, 0, lambda: cls_with_init.user_cls(*cls_with_init.args, **cls_with_init.kwargs))

    @property
    def world_size(self) -> int:
        return 1

    @property
    def worker(self):
        """The worker object itself (inspect its state directly when debugging)."""
        return self._worker

    @staticmethod
    def _guard(info: CallInfo, rank: int, fn):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - re-raised with the role/method/rank named
            raise WorkerError(info.role, info.worker_class, info.method, rank, traceback.format_exc()) from e

    def _execute(self, method: str, ranks: Iterable[int], plan: DispatchPlan) -> list:
        out = []
        for r in ranks:
            args, kwargs = plan.for_rank(r)
            if self._host_role is None:
                fn = getattr(self._worker, method)
            else:
                fn = lambda *a, **k: self._worker.call_role(self._host_role, method, *a, **k)  # noqa: E731
            out.append(self._guard(self._info(method, [r]), r, lambda: fn(*args, **kwargs)))
        return out

    def _wait(self, handles: list, info: CallInfo) -> list:
        return list(handles)

    def shutdown(self) -> None:
        # In-process workers outlive nothing: what they hold beyond Python objects (a vLLM engine's driver thread
        # and memory) is released now, not at interpreter exit. (Ray workers die with their processes.)
        release = getattr(self._worker, "release", None)
        if callable(release):
            release()
        self._worker = None
