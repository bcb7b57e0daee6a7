"""Resource pools over Ray placement groups (starting Ray: ``ray_init.py``).

A ``RayResourcePool`` reserves, per node, one STRICT_PACK placement group with one bundle per worker
process (``{"CPU": num_cpus_per_worker * max_colocate_count}`` plus one GPU when ``use_gpu``), as in
HybridFlow's ResourcePool (§4.2 of the paper): roles mapped to the same pool share its devices
(colocation), roles on different pools run on disjoint devices (split placement).

The pool checks the cluster's resources *before* asking for placement groups, because an unsatisfiable
placement group otherwise just waits forever; and it bounds the wait for ``pg.ready()``.
"""

from __future__ import annotations

import itertools

from hybridflow.controller.errors import ResourceUnavailableError
from hybridflow.controller.ray_init import init_ray
from hybridflow.controller.worker_group import ResourcePool

__all__ = ["RayResourcePool", "init_ray", "cluster_summary"]

_POOL_IDS = itertools.count()


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
