"""Backend-neutral pieces of a worker group: the call path dispatch -> execute -> wait -> collect.

A ``WorkerGroup`` exposes every ``@register``-ed method of its worker class as an attribute, so the
controller writes ``wg.compute_values(batch)``. The backends (``ray_backend.py``: one process per rank;
``local_backend.py``: the worker in the controller's process) only implement how to start a method on
some ranks (:meth:`WorkerGroup._execute`) and how to wait for the results (:meth:`WorkerGroup._wait`);
dispatching, collecting, padding and futures are shared here so both backends give the same results.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any, Iterable

from hybridflow.controller.decorator import (
    DispatchMode,
    DispatchPlan,
    Execute,
    MethodSpec,
    concat_collect,
    get_dispatch_mode,
    registered_methods,
    validate_dispatch_info,
)
from hybridflow.protocol import DataProtoFuture

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup", "CallInfo", "unwrap_worker_class"]


def unwrap_worker_class(cls: Any) -> type:
    """The plain Python class behind ``ray.remote(cls)`` (or ``cls`` itself)."""
    return getattr(cls, "__ray_actor_class__", cls)


class ClassWithInitArgs:
    """A worker class plus the arguments its constructor gets on every rank.

    ``cls`` may be a plain class or ``ray.remote(cls)``; each backend wraps or unwraps as it needs.
    """

    def __init__(self, cls: Any, *args: Any, **kwargs: Any):
        self.cls = cls
        self.args = args
        self.kwargs = kwargs
        # Ray only: extra thread pools, {name: threads}, for methods the caller starts with
        # ``.options(concurrency_group=name)`` so they run beside the worker's dispatched calls (e.g. the
        # rollout requests a hybrid worker serves).  The local backend runs everything in the caller's thread.
        self.concurrency_groups: dict[str, int] = {}

    @property
    def user_cls(self) -> type:
        return unwrap_worker_class(self.cls)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.user_cls.__name__})"


class ResourcePool:
    """How many worker processes to start on each node (``process_on_nodes=[2, 2]``: 2 nodes x 2 ranks)."""

    def __init__(self, process_on_nodes: list[int], use_gpu: bool = False, max_colocate_count: int = 1):
        if not process_on_nodes or any(int(n) <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be a non-empty list of positive counts, got {process_on_nodes}")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.use_gpu = bool(use_gpu)
        self.max_colocate_count = int(max_colocate_count)

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def local_ranks(self) -> list[tuple[int, int, int]]:
        """``(node_index, local_rank, local_world_size)`` for every global rank, in rank order."""
        return [(node, lr, n) for node, n in enumerate(self.process_on_nodes) for lr in range(n)]


@dataclass(frozen=True)
class CallInfo:
    """Who is being called, so a failure can name role, class, method and rank."""

    role: str
    worker_class: str
    method: str
    ranks: tuple[int, ...]


class _GroupMethod:
    """The group-side stand-in for one registered worker method."""

    def __init__(self, group: "WorkerGroup", name: str, spec: MethodSpec, doc: str | None):
        self._group = group
        self._name = name
        self._spec = spec
        self.__name__ = name
        self.__doc__ = doc

    def __call__(self, *args, **kwargs):
        return self._group._call(self._name, self._spec, args, kwargs)

    def __repr__(self) -> str:
        return f"<{self._group.role}.{self._name} ({self._spec.dispatch_mode})>"


class WorkerGroup:
    """Shared call logic; subclasses provide ``world_size``, ``_execute`` and ``_wait``.

    ``role`` names the group in errors; ``_host_role`` is set on views of a colocated group
    (:meth:`spawn`), where each process hosts several role objects and calls are routed to one of them.
    """

    def __init__(self, role: str, worker_cls: type):
        self.role = role
        self._worker_cls = worker_cls
        self._host_role: str | None = None
        self._dispatch_info: dict[str, list[tuple[int, bool]]] = {}
        self._bound: list[str] = []
        self._bind_worker_methods(worker_cls)

    # ------------------------------------------------------------------ backend interface
    @property
    def world_size(self) -> int:
        raise NotImplementedError

    @property
    def host_role(self) -> str | None:
        """The role this view routes to inside colocated processes (``None`` for a plain group)."""
        return self._host_role

    def _execute(self, method: str, ranks: Iterable[int], plan: DispatchPlan) -> list:
        """Start ``method`` on ``ranks`` with their planned arguments; returns one handle per rank."""
        raise NotImplementedError

    def _wait(self, handles: list, info: CallInfo) -> list:
        """Values of ``handles``; raises ``WorkerError`` / ``WorkerDiedError`` naming the failing rank."""
        raise NotImplementedError

    def _resolver(self, info: CallInfo):
        """A picklable ``handles -> values`` for ``DataProtoFuture.resolve_fn`` (None: default ray.get)."""
        return None

    def execute_all(self, method: str, *args, **kwargs) -> list:
        """Run any worker method (registered or not) on every rank with the same arguments."""
        return self._run_plain(method, range(self.world_size), args, kwargs)

    def execute_rank_zero(self, method: str, *args, **kwargs) -> Any:
        return self._run_plain(method, [0], args, kwargs)[0]

    def _run_plain(self, method: str, ranks: Iterable[int], args, kwargs) -> list:
        ranks = list(ranks)
        plan = DispatchPlan(tuple([a] * self.world_size for a in args), {k: [v] * self.world_size for k, v in kwargs.items()})
        return self._wait(self._execute(method, ranks, plan), self._info(method, ranks))

    # ------------------------------------------------------------------ binding
    def _bind_worker_methods(self, worker_cls: type) -> None:
        for name, spec in registered_methods(worker_cls).items():
            if name in self.__dict__ or hasattr(type(self), name):
                raise AttributeError(
                    f"{worker_cls.__name__}.{name} clashes with a WorkerGroup attribute; rename the worker method"
                )
            get_dispatch_mode(spec.dispatch_mode)  # fail at group creation on an unknown mode
            doc = getattr(worker_cls, name).__doc__
            setattr(self, name, _GroupMethod(self, name, spec, doc))
            self._bound.append(name)

    @property
    def method_names(self) -> list[str]:
        return sorted(self._bound)

    def _info(self, method: str, ranks: Iterable[int]) -> CallInfo:
        return CallInfo(self.role, self._worker_cls.__name__, method, tuple(ranks))

    # ------------------------------------------------------------------ the call path
    def _call(self, method: str, spec: MethodSpec, args: tuple, kwargs: dict) -> Any:
        mode = get_dispatch_mode(spec.dispatch_mode)
        plan = mode.plan(self, *args, **kwargs)
        execute = mode.execute_mode or spec.execute_mode
        ranks = list(range(self.world_size)) if execute is Execute.ALL else [0]
        handles = self._execute(method, ranks, plan)
        info = self._info(method, ranks)
        if not spec.blocking:
            return self._future(mode, execute, plan, handles, info)
        outputs = self._wait(handles, info)
        if execute is Execute.RANK_ZERO:
            return outputs[0]
        if mode.returns_dataproto:
            return concat_collect(outputs, self._collect_ranks(mode), plan.pad_size, plan.padded_len)
        return mode.collect_fn(self, outputs)

    def _future(self, mode: DispatchMode, execute: Execute, plan: DispatchPlan, handles: list, info: CallInfo):
        if execute is Execute.RANK_ZERO:
            return handles[0]
        if mode.returns_dataproto:
            collect = functools.partial(
                concat_collect, ranks=self._collect_ranks(mode), pad_size=plan.pad_size, padded_len=plan.padded_len
            )
            return DataProtoFuture(collect_fn=collect, futures=handles, resolve_fn=self._resolver(info))
        return handles

    def _collect_ranks(self, mode: DispatchMode) -> list[int] | None:
        return mode.collect_ranks(self) if mode.collect_ranks is not None else None

    def dispatch_info(self, mesh_name: str) -> list[tuple[int, bool]]:
        """``(dp_rank, is_collect)`` of every rank for ``mesh_name``, asked once and cached."""
        if mesh_name not in self._dispatch_info:
            info = [tuple(x) for x in self._run_plain("_query_dispatch_info", range(self.world_size), (mesh_name,), {})]
            validate_dispatch_info(mesh_name, info)
            self._dispatch_info[mesh_name] = info
        return self._dispatch_info[mesh_name]

    # ------------------------------------------------------------------ colocation
    def spawn(self, prefix_set: Iterable[str]) -> dict[str, "WorkerGroup"]:
        """Per-role views of a colocated group (see ``colocate.py``): ``{role: group}``.

        The views share this group's processes; each exposes only its role's registered methods and
        routes calls to that role's object inside every process.
        """
        roles = getattr(self._worker_cls, "role_classes", None)
        if roles is None:
            raise TypeError(
                f"spawn() needs a colocated worker group (create_colocated_worker_cls); "
                f"'{self.role}' runs {self._worker_cls.__name__}"
            )
        views = {}
        for role in prefix_set:
            if role not in roles:
                raise KeyError(f"role '{role}' is not colocated in this group; roles: {sorted(roles)}")
            view = copy.copy(self)
            for name in self._bound:
                view.__dict__.pop(name, None)
            view.role = role
            view._host_role = role
            view._worker_cls = roles[role]
            view._dispatch_info = {}
            view._bound = []
            view._bind_worker_methods(roles[role])
            views[role] = view
        return views
