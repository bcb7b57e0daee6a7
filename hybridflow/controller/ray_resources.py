"""Ray start-up and resource pools over placement groups.

A ``RayResourcePool`` reserves, per node, one STRICT_PACK placement group with one bundle per worker
process (``{"CPU": num_cpus_per_worker * max_colocate_count}`` plus one GPU when ``use_gpu``), as in
HybridFlow's ResourcePool (§4.2 of the paper): roles mapped to the same pool share its devices
(colocation), roles on different pools run on disjoint devices (split placement).

The pool checks the cluster's resources *before* asking for placement groups, because an unsatisfiable
placement group otherwise just waits forever; and it bounds the wait for ``pg.ready()``.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from hybridflow.controller.errors import RayInitError, ResourceUnavailableError
from hybridflow.controller.worker_group import ResourcePool

__all__ = ["RayResourcePool", "init_ray", "cluster_summary"]

_POOL_IDS = itertools.count()


def init_ray(ray_init_kwargs: dict[str, Any] | None = None) -> None:
    """Start (or connect to) Ray once, as verl's ``ray.init(**ray_kwargs.ray_init)``.

    Which cluster: ``address`` when given (``"auto"``, ``host:port``, ``ray://...``); else the ``RAY_ADDRESS``
    environment variable when set (how ``ray job submit`` hands a cluster to a job, and how a user points
    runs at a ``ray start --head`` cluster: attaching skips the seconds of starting GCS, raylet and agents);
    else a new local instance -- never a cluster merely found running on the machine. Only a local instance
    started here gets the lean defaults (no dashboard: ~1 s and ~150 MB on a laptop); a cluster that is
    attached to keeps its own settings. Failures raise :class:`RayInitError` repeating what was asked.
    """
    import ray

    if ray.is_initialized():
        return
    kwargs = dict(ray_init_kwargs or {})
    address = kwargs.get("address")
    if address in (None, "") and os.environ.get("RAY_ADDRESS"):
        kwargs.pop("address", None)  # ray.init reads RAY_ADDRESS itself
        where = f"the cluster in RAY_ADDRESS={os.environ['RAY_ADDRESS']!r}"
        _check_reachable(os.environ["RAY_ADDRESS"], field="the RAY_ADDRESS environment variable")
    elif address in (None, "", "local"):
        # Explicitly "local": without an address ray.init would also join the last cluster that `ray start`
        # left running on this machine (/tmp/ray/ray_current_cluster), i.e. attach to a stray cluster.
        kwargs["address"] = "local"
        kwargs.setdefault("include_dashboard", False)
        where = "a new local Ray instance"
    else:
        where = str(address)
        _check_reachable(str(address))
    _keep_python_signal_handlers()
    try:
        ray.init(**kwargs)
    except Exception as e:  # noqa: BLE001 - re-raised with the request attached
        hint = ""
        if "auth" in f"{type(e).__name__} {e} {e.__cause__}".lower():
            hint = (" The cluster uses token authentication (what `ray start` of Ray 2.60 enables by default): "
                    "export RAY_AUTH_MODE=token on this machine (the token is read from ~/.ray/auth_token).")
        raise RayInitError(
            f"ray.init failed while connecting to {where} with arguments {kwargs}: {type(e).__name__}: {e}. "
            "Check ray_kwargs.ray_init (address, num_cpus, num_gpus) or run `ray status` on the cluster." + hint
        ) from e


def _keep_python_signal_handlers() -> None:
    """Keep Ray's C++ crash handler out of this (driver) process: it also catches SIGTERM, and a second SIGTERM
    then aborts the driver (exit 134, no checkpoint, orphaned Ray processes) instead of reaching the
    trainer's handler (hybridflow.trainer.signals).  Worker processes keep it (their crash stacks)."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


def _check_reachable(address: str, timeout_s: float = 5.0, field: str = "ray_kwargs.ray_init.address") -> None:
    """Fail in seconds on an unreachable ``host:port`` (``ray.init`` itself retries for minutes)."""
    import socket

    if address == "auto" or "://" in address or ":" not in address:
        return  # "auto" reads RAY_ADDRESS / the local session; ray:// client addresses are checked by Ray
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise RayInitError(
            f"cannot reach the Ray head at {field}={address!r} ({type(e).__name__}: {e}). "
            "Start it with `ray start --head` on that machine, fix the address, or leave the address unset "
            "(and RAY_ADDRESS unset) to start a local Ray instance."
        ) from e


def cluster_summary() -> str:
    """One line per alive node with its total resources, for error messages."""
    import ray

    lines = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        res = {k: v for k, v in node["Resources"].items() if k in ("CPU", "GPU", "memory")}
        if "memory" in res:
            res["memory"] = f"{res['memory'] / 2**30:.1f}GiB"
        lines.append(f"  node {node['NodeID'][:8]} ({node['NodeManagerAddress']}): {res}")
    return "\n".join(lines) or "  (no alive nodes)"


class RayResourcePool(ResourcePool):
    """Worker slots on Ray nodes: ``RayResourcePool(process_on_nodes=[2], use_gpu=False)``.

    ``max_colocate_count`` is how many *separate* worker processes may share one slot (e.g. a
    reward-model group next to the actor group); colocated roles inside one process need only 1.
    ``threads_per_worker`` is each process's torch thread count when it differs from the CPUs it reserves (the
    trainer gives CPU workers the node's cores divided among its processes; the reservation stays 1 CPU so that
    reward and agent-loop actors still find CPUs to schedule on). Placement groups are created on first use and
    live until :meth:`release`.
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = False,
        max_colocate_count: int = 1,
        num_cpus_per_worker: float = 1.0,
        name_prefix: str | None = None,
        ready_timeout_s: float = 60.0,
        threads_per_worker: int | None = None,
    ):
        super().__init__(process_on_nodes, use_gpu, max_colocate_count)
        if num_cpus_per_worker <= 0:
            raise ValueError(f"num_cpus_per_worker must be > 0, got {num_cpus_per_worker}")
        if threads_per_worker is not None and threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {threads_per_worker}")
        self.num_cpus_per_worker = float(num_cpus_per_worker)
        self.threads_per_worker = int(threads_per_worker or max(1, int(num_cpus_per_worker)))
        self.name_prefix = name_prefix or f"hybridflow_pool{next(_POOL_IDS)}"
        self.ready_timeout_s = float(ready_timeout_s)
        self._pgs: list | None = None
        self._tenants: list[str] = []  # worker groups whose processes occupy the bundles

    def __repr__(self) -> str:
        return (
            f"RayResourcePool(process_on_nodes={self.process_on_nodes}, use_gpu={self.use_gpu}, "
            f"max_colocate_count={self.max_colocate_count}, num_cpus_per_worker={self.num_cpus_per_worker})"
        )

    @property
    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.num_cpus_per_worker * self.max_colocate_count}
        if self.use_gpu:
            b["GPU"] = 1.0
        return b

    @property
    def actor_resources(self) -> dict[str, float]:
        """What each worker process takes from its bundle."""
        res = {"num_cpus": self.num_cpus_per_worker}
        if self.use_gpu:
            res["num_gpus"] = 1.0 / self.max_colocate_count
        return res

    def get_placement_groups(self) -> list:
        """One ready placement group per node entry (created on first call)."""
        if self._pgs is None:
            self._pgs = self._create_placement_groups()
        return self._pgs

    def _create_placement_groups(self) -> list:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        if not ray.is_initialized():
            raise ResourceUnavailableError(f"{self!r}: Ray is not running; call init_ray(...) first")
        self._check_resources()
        pgs = [
            placement_group([dict(self.bundle) for _ in range(n)], strategy="STRICT_PACK", name=f"{self.name_prefix}_{i}")
            for i, n in enumerate(self.process_on_nodes)
        ]
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.ready_timeout_s)
        if len(ready) < len(pgs):
            for pg in pgs:
                remove_placement_group(pg)
            raise ResourceUnavailableError(
                f"{self!r}: placement groups not ready after {self.ready_timeout_s:.0f}s "
                f"({len(ready)}/{len(pgs)} ready). Each entry of process_on_nodes must fit on ONE node "
                f"(bundle {self.bundle} each). Available now: {ray.available_resources()}\nNodes:\n{cluster_summary()}"
            )
        return pgs

    def _check_resources(self) -> None:
        import ray

        avail = ray.available_resources()
        need = {k: v * self.world_size for k, v in self.bundle.items()}
        short = {k: (v, avail.get(k, 0.0)) for k, v in need.items() if avail.get(k, 0.0) + 1e-9 < v}
        if short:
            detail = ", ".join(f"{k}: needs {v:g}, available {a:g}" for k, (v, a) in short.items())
            fix = (
                "give Ray more (ray_kwargs.ray_init.num_cpus / num_gpus), lower trainer.nnodes x n_gpus_per_node, "
                "or release other pools"
            )
            raise ResourceUnavailableError(
                f"{self!r} asks for {self.world_size} worker slots of {self.bundle} but the Ray cluster cannot "
                f"provide them ({detail}); {fix}.\nNodes:\n{cluster_summary()}"
            )
        largest = max(self.process_on_nodes)
        for k, v in self.bundle.items():
            per_node = [n["Resources"].get(k, 0.0) for n in ray.nodes() if n.get("Alive")]
            if per_node and max(per_node) + 1e-9 < v * largest:
                raise ResourceUnavailableError(
                    f"{self!r}: {largest} workers must share one node ({v * largest:g} {k}) but the largest node "
                    f"has {max(per_node):g} {k}; split process_on_nodes over more nodes.\nNodes:\n{cluster_summary()}"
                )

    def acquire(self, role: str) -> None:
        """Book one process per bundle for group ``role``; an over-full pool is an error, not a silent wait."""
        if len(self._tenants) >= self.max_colocate_count:
            raise ResourceUnavailableError(
                f"{self!r} already hosts {len(self._tenants)} worker group(s) {self._tenants}; '{role}' would be "
                f"process number {len(self._tenants) + 1} on each bundle, above max_colocate_count="
                f"{self.max_colocate_count}. Colocate the roles in one process (create_colocated_worker_cls), "
                "raise max_colocate_count, or use another pool."
            )
        self._tenants.append(role)

    def give_back(self, role: str) -> None:
        if role in self._tenants:
            self._tenants.remove(role)

    def release(self) -> None:
        """Remove the placement groups (kill the pool's worker groups first)."""
        if self._pgs is None:
            return
        from ray.util.placement_group import remove_placement_group

        for pg in self._pgs:
            remove_placement_group(pg)
        self._pgs = None
