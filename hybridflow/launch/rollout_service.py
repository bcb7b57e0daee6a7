"""The rollout service of a run: the engine replicas the agent loops generate with, and the manager over them.

* the hybrid engine (``actor_rollout_ref.hybrid_engine=true``): one replica per actor rank, generating with the
  actor's own module (``HybridFleet``);
* standalone vLLM server processes (``rollout.name=vllm`` on a pool of their own), fed the actor's weights as a
  delta after every update (``VLLMServerFleet``);
* standalone ``hf`` replicas on the rollout pool (``rollout.nnodes x rollout.n_gpus_per_node``, one in this process
  with ``trainer.backend=local``), fed the actor's weights by the checkpoint engine: a bucketed broadcast from the
  actor's rank 0 (``rollout.checkpoint_engine.*``; in fully async training ``async_training.checkpoint_engine.*``).

The agent-loop manager over the fleet is the run's one generation path (``WorkerGroups.rollout``).
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.v1 import generates_beside_training
from hybridflow.launch.cpu_threads import cpu_threads_per_process
from hybridflow.launch.inputs import load_processor_for
from hybridflow.launch.processes import Runtime, resolve_device
from hybridflow.rollout.service.standalone_fleet import StandaloneFleet
from hybridflow.rollout.weights.checkpoint_engine import resolve_backend
from hybridflow.trainer.actor_weights import ActorWeightExport, ActorWeightSource

__all__ = ["rollout_pool_devices", "start_rollout_service", "start_standalone_fleet", "weight_sync_settings"]

_MB = 1 << 20


def start_rollout_service(runtime: Runtime, config, tokenizer, reward_fn=None, processor=None) -> None:
    """The rollout service over the loaded workers: one replica per actor/rollout rank (the hybrid engine)
    and the agent-loop manager (``rollout.agent.num_workers`` workers) that the trainer generates with.
    ``reward_fn`` (the training reward manager) scores trajectories in the agent loops when verl's reward
    loop applies and the backend is local. ``processor``: a vision-language model's (loaded when not given)."""
    from hybridflow.agents import AgentLoopManager
    from hybridflow.rollout.service.fleet import HybridFleet

    arr = config.actor_rollout_ref
    if arr.hybrid_engine:
        fleet = HybridFleet(runtime.groups.actor_rollout)
    elif arr.rollout.name == "vllm":  # standalone vLLM server processes, fed the actor's weights after every update
        from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet
        
        fleet = VLLMServerFleet.from_config(config, ActorWeightExport(runtime.groups.actor_rollout),
                                            resolve_device(config))
        runtime._closers.append(fleet.shutdown)
        runtime.n_devices += rollout_pool_devices(config)
    else:  # hf replicas on the rollout pool, fed weights by the checkpoint engine
        fleet = start_standalone_fleet(config, runtime.groups.actor_rollout, resolve_device(config) == "cuda",
                                       runtime._closers)
        runtime.n_devices += rollout_pool_devices(config)
    if processor is None:
        processor = load_processor_for(config)
    manager = AgentLoopManager(config, fleet, config.trainer.backend, tokenizer=tokenizer, processor=processor,
                               reward_manager=reward_fn)
    runtime._closers.append(manager.shutdown)
    runtime.groups.rollout = manager


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
        check_weights=bool(config.trainer.drift.check_weights),
    )
