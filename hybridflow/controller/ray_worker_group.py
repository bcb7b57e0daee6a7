"""The Ray backend: one Ray actor (process) per rank, placed in a ``RayResourcePool``'s bundles.

Each actor gets a torchrun-like environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and ``OMP_NUM_THREADS`` equal to the pool's
``threads_per_worker`` (on CPU the trainer divides the node's cores among its processes), so N workers on N cores
do not each spawn N OpenMP threads. All ranks start in parallel;
rank 0 picks the rendezvous address/port on its own node, and the group then hands it to the others.

Waiting is a poll loop over ``ray.wait`` so that a failure on one rank (an exception, or a process
that died) is raised within ``poll_interval_s`` even while the other ranks block in a collective.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any, Iterable

from hybridflow.controller.decorator import DispatchPlan
from hybridflow.controller.errors import ControllerError, NodeLostError, WorkerDiedError, WorkerError
from hybridflow.controller.node_loss import lost_node_of
from hybridflow.controller.ray_resources import RayResourcePool
from hybridflow.controller.worker import ENV_DEVICE, ENV_NUM_THREADS, ENV_ROLE
from hybridflow.controller.worker_group import CallInfo, ClassWithInitArgs, WorkerGroup
from hybridflow.protocol import DataProto

__all__ = ["RayClassWithInitArgs", "RayWorkerGroup", "wait_for_outputs"]


class RayClassWithInitArgs(ClassWithInitArgs):
    """``RayClassWithInitArgs(cls=ray.remote(MyWorker), **init_kwargs)``; extra Ray actor options via
    :meth:`update_options` (e.g. ``{"runtime_env": {...}}``; env vars are merged with the group's)."""

    def __init__(self, cls: Any, *args: Any, **kwargs: Any):
        super().__init__(cls, *args, **kwargs)
        self.actor_options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        self.actor_options.update(options)


def _remote_class(cls_with_init: ClassWithInitArgs):
    """The Ray actor class of a worker class (with its ``concurrency_groups``); a class already made remote passes."""
    import ray

    groups = dict(getattr(cls_with_init, "concurrency_groups", {}))
    if hasattr(cls_with_init.cls, "remote"):
        if groups:
            raise ValueError(f"{cls_with_init!r}: pass the plain class (not ray.remote(cls)) to use "
                             f"concurrency_groups {sorted(groups)}")
        return cls_with_init.cls
    return ray.remote(concurrency_groups=groups)(cls_with_init.cls) if groups else ray.remote(cls_with_init.cls)


def _placement(pgs: list, local_ranks) -> list[tuple[str, str]]:
    """(node id, node IP) of every rank: the node Ray placed its placement-group bundle on."""
    import ray
    from ray.util import placement_group_table

    ips = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    tables = [placement_group_table(pg).get("bundles_to_node_id", {}) for pg in pgs]
    nodes = [tables[node].get(local_rank, "?") for node, local_rank, _ in local_ranks]
    return [(node, ips.get(node, "?")) for node in nodes]


def _to_error(exc: BaseException, info: CallInfo, rank: int) -> Exception:
    from ray import exceptions as rex

    if isinstance(exc, rex.RayActorError):
        if exc.actor_init_failed:  # the constructor raised: a code error, not a crash
            return WorkerError(info.role, info.worker_class, "__init__", rank, _traceback_of(exc))
        return _died(info, rank, _traceback_of(exc), exc.actor_id)
    if isinstance(exc, rex.RayTaskError):
        return WorkerError(info.role, info.worker_class, info.method, rank, _traceback_of(exc),
                           remote_cause=getattr(exc, "cause", None))
    if isinstance(exc, rex.RayError):
        return _died(info, rank, f"{type(exc).__name__}: {exc}", None)
    return WorkerError(info.role, info.worker_class, info.method, rank, f"{type(exc).__name__}: {exc}")


def _died(info: CallInfo, rank: int, detail: str, actor_id: str | None) -> WorkerDiedError:
    """A dead worker; a :class:`NodeLostError` naming the node when the worker's whole node is gone with it."""
    lost = lost_node_of(actor_id)
    if lost is None:
        return WorkerDiedError(info.role, info.worker_class, info.method, rank, detail)
    return NodeLostError(info.role, info.worker_class, info.method, rank, detail, lost.node_id, lost.ip, lost.how)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _traceback_of(err) -> str:
    tb = getattr(err, "traceback_str", None) or str(err)
    return _ANSI.sub("", tb)  # Ray colours the header line; keep logs plain


def wait_for_outputs(refs: list, info: CallInfo, poll_interval_s: float = 1.0) -> list:
    """Values of ``refs`` (ranks ``info.ranks``); the first failing rank raises a named error.

    Module-level so ``DataProtoFuture.resolve_fn`` can carry it (partial) to other workers.
    """
    import ray

    out: list = [None] * len(refs)
    pending = list(range(len(refs)))
    while pending:
        ready, _ = ray.wait([refs[i] for i in pending], num_returns=len(pending), timeout=poll_interval_s)
        ready_set = set(ready)
        done = [i for i in pending if refs[i] in ready_set]
        if not done:
            continue
        try:
            for i, v in zip(done, ray.get([refs[i] for i in done])):
                out[i] = v
        except Exception:  # noqa: BLE001 - find which rank failed and name it
            for i in done:
                try:
                    out[i] = ray.get(refs[i])
                except Exception as e:  # noqa: BLE001
                    raise _to_error(e, info, info.ranks[i]) from None
        pending = [i for i in pending if i not in set(done)]
    return out


class RayWorkerGroup(WorkerGroup):
    """``RayWorkerGroup(resource_pool, ray_cls_with_init)``: the worker's registered methods as attributes.

    ``role`` names the group in errors (default: the worker class name). Call :meth:`shutdown` to kill
    the processes; the pool's placement groups stay for the next group.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init: ClassWithInitArgs,
        role: str | None = None,
        poll_interval_s: float = 1.0,
    ):
        if not isinstance(resource_pool, RayResourcePool):
            raise TypeError(f"RayWorkerGroup needs a RayResourcePool, got {type(resource_pool).__name__}")
        super().__init__(role or ray_cls_with_init.user_cls.__name__, ray_cls_with_init.user_cls)
        self.resource_pool = resource_pool
        self.poll_interval_s = float(poll_interval_s)
        self._workers: list = []
        self.placement: list[tuple[str, str]] = []  # (node id, node IP) of every rank, once started
        self._tenant = self.role  # the pool booking; views of a colocated group share it
        resource_pool.acquire(self._tenant)
        try:
            self._create_workers(ray_cls_with_init)
        except BaseException:
            self.shutdown()
            raise

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list:
        """The Ray actor handles, in rank order."""
        return list(self._workers)

    # ------------------------------------------------------------------ start-up
    def _create_workers(self, cls_with_init: ClassWithInitArgs) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pool = self.resource_pool
        pgs = pool.get_placement_groups()
        remote_cls = _remote_class(cls_with_init)
        options = dict(getattr(cls_with_init, "actor_options", {}))
        runtime_env = dict(options.pop("runtime_env", {}))
        user_env = dict(runtime_env.pop("env_vars", {}))
        for rank, (node, local_rank, local_world) in enumerate(pool.local_ranks()):
            actor = remote_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pgs[node], placement_group_bundle_index=local_rank
                ),
                runtime_env={**runtime_env, "env_vars": {**user_env, **self._rank_env(rank, local_rank, local_world)}},
                max_restarts=0,
                **pool.actor_resources,
                **options,
            ).remote(*cls_with_init.args, **cls_with_init.kwargs)
            self._workers.append(actor)
        self._wait_for_constructors()
        self.placement = _placement(pgs, pool.local_ranks())
        if len({node for node, _ in self.placement}) > 1:  # a multi-node group says where its ranks run
            where = ", ".join(f"rank {r} on node {node[:8]} ({ip})" for r, (node, ip) in enumerate(self.placement))
            print(f"hybridflow: {self.role} ranks: {where}", file=sys.stderr, flush=True)

    def _rank_env(self, rank: int, local_rank: int, local_world: int) -> dict[str, str]:
        """The environment variables of one rank's process (over the user's ``runtime_env`` ones)."""
        pool = self.resource_pool
        threads = str(pool.threads_per_worker)
        return {
            "RANK": str(rank),
            "WORLD_SIZE": str(pool.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": "",  # rank 0 picks them in its constructor; the others get them below
            "MASTER_PORT": "",
            "OMP_NUM_THREADS": threads,
            ENV_NUM_THREADS: threads,
            ENV_DEVICE: "cuda" if pool.use_gpu else "cpu",
            ENV_ROLE: self.role,
        }

    def _wait_for_constructors(self) -> None:
        """All constructors run in parallel (start-up is dominated by importing torch in each process); then rank
        0's rendezvous address, only needed later by init_distributed, goes to the other ranks."""
        init = CallInfo(self.role, self._worker_cls.__name__, "__init__", tuple(range(self.resource_pool.world_size)))
        wait_for_outputs([w.__ray_ready__.remote() for w in self._workers], init, self.poll_interval_s)
        addr_port = wait_for_outputs([self._workers[0]._get_master_addr_port.remote()], init, self.poll_interval_s)[0]
        refs = [w._set_master_addr_port.remote(*addr_port) for w in self._workers[1:]]
        wait_for_outputs(refs, init, self.poll_interval_s)

    # ------------------------------------------------------------------ backend interface
    def _execute(self, method: str, ranks: Iterable[int], plan: DispatchPlan) -> list:
        import ray

        if not self._workers:
            raise ControllerError(f"worker group '{self.role}' was shut down; '{method}' cannot run")

        calls = [plan.for_rank(r) for r in ranks]
        # A DataProto sent to several ranks (ONE_TO_ALL, TP/SP replicas) goes to the object store once;
        # one sent to a single rank is passed directly (Ray stores large arguments itself).
        uses: dict[int, int] = {}
        for args, kwargs in calls:
            for v in (*args, *kwargs.values()):
                if isinstance(v, DataProto):
                    uses[id(v)] = uses.get(id(v), 0) + 1
        shared: dict[int, Any] = {}

        def put(v):
            if isinstance(v, DataProto) and uses[id(v)] > 1:
                if id(v) not in shared:
                    shared[id(v)] = ray.put(v)
                return shared[id(v)]
            return v

        refs = []
        for r, (args, kwargs) in zip(ranks, calls):
            args = tuple(put(a) for a in args)
            kwargs = {k: put(v) for k, v in kwargs.items()}
            actor = self._workers[r]
            if self._host_role is None:
                refs.append(getattr(actor, method).remote(*args, **kwargs))
            else:
                refs.append(actor.call_role.remote(self._host_role, method, *args, **kwargs))
        return refs

    def _wait(self, handles: list, info: CallInfo) -> list:
        return wait_for_outputs(handles, info, self.poll_interval_s)

    def _resolver(self, info: CallInfo):
        return functools.partial(wait_for_outputs, info=info, poll_interval_s=self.poll_interval_s)

    def shutdown(self) -> None:
        """Kill this group's processes (and so every colocated view of them)."""
        import ray

        for w in self._workers:
            ray.kill(w, no_restart=True)
        self._workers.clear()  # in place: the colocated views share this list
        self.resource_pool.give_back(self._tenant)
