"""Split placement: the standalone rollout replicas of a run on their own pool, and the weights they are sent.

With ``actor_rollout_ref.hybrid_engine=false`` the actor trains on the trainer pool (``trainer.nnodes x
trainer.n_gpus_per_node``) and generation runs on ``rollout.nnodes x rollout.n_gpus_per_node`` replicas
(:class:`~hybridflow.workers.rollout_server_worker.RolloutServerWorker`, one per device; one in this process
with ``trainer.backend=local``).  The trainer pushes the actor's weights to them through the checkpoint
engine: bucketed broadcast from the actor's rank 0 (``rollout.checkpoint_engine.*``; in fully async training
``async_training.checkpoint_engine.*``, verl's keys there).
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.v1 import generates_beside_training
from hybridflow.rollout.weights.checkpoint_engine import resolve_backend
from hybridflow.rollout.service.standalone_fleet import StandaloneFleet

__all__ = ["ActorWeightExport", "ActorWeightSource", "start_standalone_fleet", "weight_sync_settings", "rollout_pool_devices"]

_MB = 1 << 20


class ActorWeightSource:
    """The trainer's side of the weight sync, on the actor worker group (its rank 0 sends)."""

    def __init__(self, actor_group: Any):
        self.group = actor_group

    def address(self) -> tuple[str, int]:
        return next(a for a in self.group.weight_sync_address() if a is not None)

    def connect(self, spec) -> None:
        self.group.connect_weight_sync(spec)

    def send(self, full: bool = False) -> dict[str, float]:
        return self.group.send_rollout_weights(full)[0]

    def commit(self, verified: bool) -> None:
        self.group.commit_rollout_weights(verified)


class ActorWeightExport:
    """The actor's weights for standalone vLLM servers, as a delta taken on the actor's rank 0 (unchanged
    tensors never leave it): ``fetch(full)`` -> named tensors, ``stats()``, ``commit(verified)``."""

    def __init__(self, actor_group: Any):
        self.group = actor_group
        self._stats = None

    def fetch(self, full: bool = False):
        out = self.group.export_actor_weights(full)[0]
        self._stats = out["stats"]
        return out["tensors"].items()

    def stats(self):
        return self._stats

    def commit(self, verified: bool) -> None:
        self.group.commit_actor_weights(verified)


def weight_sync_settings(config) -> tuple[int, bool]:
    """``(bucket bytes, overlap)`` of the run's checkpoint engine (0 bytes: one tensor per broadcast)."""
    at = config.async_training
    if at.mode == "fully_async":
        ce = at.checkpoint_engine
        return (int(ce.device_buffer_size_M) * _MB if ce.enable else 0), bool(ce.overlap_broadcast_and_consume)
    return int(config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes) * _MB, False


def rollout_pool_devices(config) -> int:
    """Devices (CPU processes) of the rollout pool; the local backend runs one replica in this process."""
    if config.trainer.backend == "local":
        return 1
    return int(config.rollout.nnodes) * int(config.rollout.n_gpus_per_node)


def start_standalone_fleet(config, actor_group: Any, use_gpu: bool, closers: list) -> StandaloneFleet:
    """Start the replicas (their processes, their models) and the fleet over them; what it starts is added to
    ``closers`` (called in reverse order at shutdown)."""
    from hybridflow.controller import ClassWithInitArgs, create_resource_pool, create_worker_group
    from hybridflow.agents.loop_manager import rollout_stream_threads
    from hybridflow.rollout.service.replica import RAY_ROLLOUT_CONCURRENCY_GROUP
    from hybridflow.workers.rollout_server_worker import RolloutServerWorker

    backend = config.trainer.backend
    rc = config.actor_rollout_ref.rollout
    nodes = [1] if backend == "local" else [int(config.rollout.n_gpus_per_node)] * int(config.rollout.nnodes)
    kwargs = {} if backend == "local" else {"name_prefix": "hybridflow_rollout_pool"}
    if backend == "ray" and not use_gpu:
        from hybridflow.trainer.cpu_threads import cpu_threads_per_process

        kwargs["threads_per_worker"] = cpu_threads_per_process(config)
    pool = create_resource_pool(backend, nodes, use_gpu=use_gpu, **kwargs)
    release = getattr(pool, "release", None)
    if callable(release):
        closers.append(release)
    cls = ClassWithInitArgs(RolloutServerWorker, config.actor_rollout_ref)
    cls.concurrency_groups = {RAY_ROLLOUT_CONCURRENCY_GROUP: rollout_stream_threads(config)}
    group = create_worker_group(backend, pool, cls, role="rollout")
    closers.append(group.shutdown)
    local = getattr(group, "worker", None)
    if local is not None:  # in-process replica: stop its server thread (a Ray replica dies with its process)
        closers.append(local.release)
    group.init_model()
    bucket_bytes, overlap = weight_sync_settings(config)
    return StandaloneFleet(
        group, ActorWeightSource(actor_group),
        backend=resolve_backend(rc.checkpoint_engine.backend, "cuda" if use_gpu else "cpu"),
        bucket_bytes=bucket_bytes, overlap=overlap, timeout_s=float(config.actor_rollout_ref.nccl_timeout),
        keep_awake=generates_beside_training(config), seed=int(rc.seed),
        delta=bool((rc.checkpoint_engine.engine_kwargs or {}).get("delta", True)),
    )
