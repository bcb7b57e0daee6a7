"""The processes of one run: the backend (Ray or in-process), the resource pool, the role worker groups and the
rollout service over them.

``create_workers`` starts the backend and one colocated process per device (actor+rollout+ref, critic and reward
model as roles of the same process: HybridFlow's colocated placement) without loading a model; ``init_models``
loads them once the LR horizon is known; ``start_rollout_service`` puts the agent-loop manager over the replicas
(the hybrid engine, standalone vLLM servers or hf replicas on their own pool). ``RuntimeStart`` overlaps Ray's
start-up with the driver's own work. ``Runtime.close()`` releases everything in reverse order.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from hybridflow.trainer.run_inputs import load_processor_for, load_tokenizer_for

if TYPE_CHECKING:
    from hybridflow.trainer.stages import WorkerGroups

__all__ = ["Runtime", "RuntimeStart", "build_runtime", "create_workers", "init_models", "pool_options",
           "resolve_device", "start_judge_service", "start_rollout_service"]


@dataclass
class Runtime:
    """What ``build_runtime`` created; ``close()`` releases worker groups, reward pools and Ray."""

    groups: WorkerGroups
    n_devices: int
    dp_size: int
    _closers: list[Callable[[], None]] = field(default_factory=list)
    views: dict[str, Any] = field(default_factory=dict)  # role -> worker group view (for init_models)

    def close(self) -> None:
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as e:  # noqa: BLE001 - shutting down; report and keep closing the rest
                print(f"hybridflow: warning: shutdown step failed: {type(e).__name__}: {e}", file=sys.stderr)


def resolve_device(config) -> str:
    """``trainer.device``: ``auto`` picks cuda when torch sees a GPU, else cpu."""
    import torch

    wanted = config.trainer.device
    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if wanted == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu (or auto)")
    return wanted


def _actor_role(config) -> str:
    return "actor_rollout_ref" if config.use_reference_policy else "actor_rollout"


# init_model order: actor last, as verl (the actor's rollout engine is built once every model is in place).
_INIT_ORDER = ("critic", "reward_model", "actor_rollout")


def pool_options(config) -> dict[str, Any]:
    """Resource-pool options from the config: verl's ``trainer.ray_wait_register_center_timeout`` is how long the
    Ray worker slots (placement groups) may take to come up before start-up fails naming what is missing."""
    if config.trainer.backend != "ray":
        return {}
    options: dict[str, Any] = {"ready_timeout_s": float(config.trainer.ray_wait_register_center_timeout)}
    if resolve_device(config) == "cpu":
        from hybridflow.trainer.cpu_threads import cpu_threads_per_process

        options["threads_per_worker"] = cpu_threads_per_process(config)
    return options


def create_workers(config, owns_ray: bool = False) -> Runtime:
    """Start the backend and the role worker processes, without loading any model yet.

    With Ray this is the slow part of start-up (``ray.init``, then one process per rank that imports torch),
    which is why :func:`train_ppo` runs it in a background thread while it builds data and rewards (after
    starting Ray itself on its own thread, ``owns_ray``: see :class:`RuntimeStart`); the
    models are loaded afterwards by :func:`init_models`, once the LR horizon is known. On failure everything
    started so far is released before the error propagates, so no Ray instance or worker is left behind.
    """
    from hybridflow.trainer.stages import WorkerGroups

    tcfg = config.trainer
    backend = tcfg.backend
    use_gpu = resolve_device(config) == "cuda"
    runtime = Runtime(groups=WorkerGroups(actor_rollout=None), n_devices=0, dp_size=0)
    try:
        if backend == "ray":  # first: the worker-class imports below need no Ray, Ray's start is the long pole
            import ray

            from hybridflow.controller.ray_init import init_ray

            started_here = owns_ray or not ray.is_initialized()  # owns_ray: the caller started it for this run
            init_ray(dict(config.ray_kwargs.ray_init))
            if started_here:
                runtime._closers.append(ray.shutdown)
        from hybridflow.controller import (
            ClassWithInitArgs,
            create_colocated_worker_cls,
            create_resource_pool,
            create_worker_group,
        )
        from hybridflow.agents.loop_manager import rollout_stream_threads
        from hybridflow.rollout.service.replica import RAY_ROLLOUT_CONCURRENCY_GROUP
        from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

        process_on_nodes = [1] if backend == "local" else [tcfg.n_gpus_per_node] * tcfg.nnodes
        pool = create_resource_pool(backend, process_on_nodes, use_gpu=use_gpu, **pool_options(config))
        release = getattr(pool, "release", None)
        if callable(release):
            runtime._closers.append(release)
        # HybridFlow's colocated placement: every role lives in the same process per device, so the models
        # run one after another on the same devices and never wait for each other's resources.
        class_dict = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref,
                                                         _actor_role(config))}
        if config.use_critic:
            from hybridflow.workers.critic import CriticWorker

            class_dict["critic"] = ClassWithInitArgs(CriticWorker, config.critic)
        from hybridflow.trainer.runtime_roles import extra_colocated_roles, start_pooled_roles

        roles, colocated_teachers = extra_colocated_roles(config)  # reward model, judge, teachers
        class_dict.update(roles)
        host_cls = create_colocated_worker_cls(class_dict)
        # Rollout requests from the agent loops run in their own thread pool beside the dispatched calls.
        host_cls.concurrency_groups = {RAY_ROLLOUT_CONCURRENCY_GROUP: rollout_stream_threads(config)}
        host = create_worker_group(backend, pool, host_cls, role="colocated")
        runtime._closers.append(host.shutdown)
        views = host.spawn(class_dict)
        teachers = start_pooled_roles(config, views, colocated_teachers, use_gpu, runtime._closers,
                                      pool_options(config))
    except BaseException:
        runtime.close()
        raise
    runtime.views = views
    runtime.groups = WorkerGroups(actor_rollout=views["actor_rollout"],
                                  ref=views["actor_rollout"] if config.use_reference_policy else None,
                                  critic=views.get("critic"), reward_model=views.get("reward_model"),
                                  teachers=teachers)
    runtime.n_devices = runtime.dp_size = pool.world_size
    return runtime


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
        from hybridflow.trainer.rollout_pool import ActorWeightExport, rollout_pool_devices

        fleet = VLLMServerFleet.from_config(config, ActorWeightExport(runtime.groups.actor_rollout),
                                            resolve_device(config))
        runtime._closers.append(fleet.shutdown)
        runtime.n_devices += rollout_pool_devices(config)
    else:  # hf replicas on the rollout pool, fed weights by the checkpoint engine
        from hybridflow.trainer.rollout_pool import rollout_pool_devices, start_standalone_fleet

        fleet = start_standalone_fleet(config, runtime.groups.actor_rollout, resolve_device(config) == "cuda",
                                       runtime._closers)
        runtime.n_devices += rollout_pool_devices(config)
    if processor is None:
        processor = load_processor_for(config)
    manager = AgentLoopManager(config, fleet, config.trainer.backend, tokenizer=tokenizer, processor=processor,
                               reward_manager=reward_fn)
    runtime._closers.append(manager.shutdown)
    runtime.groups.rollout = manager


def init_models(runtime: Runtime, total_training_steps: int | None = None) -> None:
    """``init_model`` on every role, actor last; the trained roles get the LR horizon as an argument
    because their processes were started (and their config sent) before the dataset length was known."""
    for role in _INIT_ORDER:
        if role == "actor_rollout" and runtime.groups.teachers is not None:  # distillation teachers: frozen models
            runtime.groups.teachers.init_models()
        view = runtime.views.get(role)
        if view is None:
            continue
        view.init_model(total_training_steps=total_training_steps)  # PRIME's PRM trains: it needs the horizon


def build_runtime(config, tokenizer=None, total_training_steps: int | None = None) -> Runtime:
    """Start the backend and the role worker groups and load their models (``create_workers`` +
    ``init_models``); ``total_training_steps`` defaults to the one written into the optim configs."""
    runtime = create_workers(config)
    try:
        init_models(runtime, total_training_steps)
        start_rollout_service(runtime, config, tokenizer if tokenizer is not None else load_tokenizer_for(config))
    except BaseException:
        runtime.close()
        raise
    return runtime


class RuntimeStart:
    """The worker start-up of ``train_ppo``: in a background thread for Ray, inline for ``local``.

    Ray's start-up (``ray.init``: GCS, raylet and agent processes; then each worker process importing torch)
    takes several seconds and needs nothing the driver builds next (tokenizer, datasets, reward managers), so
    the worker processes start in a background thread while the driver goes on. ``result()`` waits and
    re-raises a start-up error unchanged (the same ``RayInitError`` / ``ResourceUnavailableError`` /
    ``WorkerError`` a sequential start raises); ``abandon()`` is for the driver failing first: it waits for the
    thread and releases whatever it started, so no Ray instance or worker outlives the run.

    ``ray.init`` itself runs here, on the calling thread, before the background thread starts. Ray forks its GCS
    and raylet from the thread that calls it, with ``PR_SET_PDEATHSIG`` (Linux fires it when that *thread*
    exits), and a fork from a secondary thread of a long-lived driver crashed in the child before exec (SIGSEGV
    in ``pthread_join``, seen repeatedly at the end of the test suite's worker processes; a fork from the main
    thread of the same processes never did). The background thread still stays parked until the runtime is
    closed, so nothing it started can lose its parent thread early.
    """

    def __init__(self, config):
        self._runtime: Runtime | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        if config.trainer.backend == "ray":
            import ray

            from hybridflow.controller.ray_init import init_ray

            owns_ray = not ray.is_initialized()
            try:
                init_ray(dict(config.ray_kwargs.ray_init))
            except Exception as e:  # noqa: BLE001 - raised by result(), as from the thread (Ctrl-C: at once)
                self._error = e
                self._ready.set()
                return
            self._thread = threading.Thread(target=self._run, args=(config, True, owns_ray),
                                            name="hybridflow-startup", daemon=True)
            self._thread.start()
        else:  # in-process backend: nothing slow to overlap, and breakpoints stay in the main thread
            self._run(config, False)
            if self._error is not None:  # nothing runs concurrently here, so fail at once
                raise self._error

    def _run(self, config, linger: bool, owns_ray: bool = False) -> None:
        try:
            self._runtime = create_workers(config, owns_ray=owns_ray)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by result()
            self._error = e
            return
        finally:
            self._ready.set()
        if linger:
            self._runtime._closers.insert(0, self._release.set)  # runs last, after ray.shutdown
            self._release.wait()

    def result(self) -> Runtime:
        self._ready.wait()
        if self._error is not None:
            raise self._error
        assert self._runtime is not None
        return self._runtime

    def abandon(self) -> None:
        self._ready.wait()
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None


def start_judge_service(config, runtime):
    """The judge of ``reward_model.rollout.name`` (``None`` without one); stopped with the runtime."""
    from hybridflow.trainer.judge_service import JUDGE_ROLE, judge_enabled, start_judge

    if not judge_enabled(config):
        return None
    return start_judge(config, runtime.views.get(JUDGE_ROLE), resolve_device(config) == "cuda", runtime._closers,
                       pool_options(config))
