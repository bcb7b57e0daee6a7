"""A role on a resource pool of its own (the reward model, the judge, each teacher, the rollout replicas): the
pool, its worker group, and the closers that give both back when the run ends."""

from __future__ import annotations

__all__ = ["own_pool_group"]


def own_pool_group(backend: str, nodes: list[int], cls, role: str, use_gpu: bool, closers: list, options: dict):
    """Create a pool of ``nodes`` processes (one in this process with the local backend; Ray placement groups named
    ``hybridflow_<role>``) and ``cls``'s worker group on it; register the releases in ``closers``."""
    from hybridflow.controller import create_resource_pool, create_worker_group

    kwargs = dict(options)
    if backend == "ray":
        kwargs["name_prefix"] = f"hybridflow_{role}"
    pool = create_resource_pool(backend, [1] if backend == "local" else nodes, use_gpu=use_gpu, **kwargs)
    release = getattr(pool, "release", None)
    if callable(release):
        closers.append(release)
    group = create_worker_group(backend, pool, cls, role=role)
    closers.append(group.shutdown)
    return group
