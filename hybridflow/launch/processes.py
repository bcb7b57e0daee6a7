"""The processes of one run: the backend (Ray or in-process), the resource pools and the role worker groups.

``create_workers`` starts the backend and one colocated process per device (actor+rollout+ref, critic and reward
model as roles of the same process: HybridFlow's colocated placement) without loading a model; ``init_models``
loads them once the LR horizon is known. ``RuntimeStart`` overlaps Ray's start-up with the driver's own work.
``Runtime.close()`` releases everything in reverse order.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from hybridflow.config.checks.parallel import data_parallel_size
from hybridflow.launch.cpu_threads import cpu_threads_per_process
from hybridflow.launch.roles import extra_colocated_roles, start_pooled_roles

if TYPE_CHECKING:
    from hybridflow.trainer.stages import WorkerGroups

__all__ = ["Runtime", "RuntimeStart", "create_workers", "init_models", "pool_options", "resolve_device"]


@dataclass
class Runtime:
    """What the launch started; ``close()`` releases worker groups, reward pools and Ray."""

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
        options["threads_per_worker"] = cpu_threads_per_process(config)
    return options


def create_workers(config, owns_ray: bool = False) -> Runtime:
    """Start the backend and the role worker processes, without loading any model yet.

    With Ray this is the slow part of start-up (``ray.init``, then one process per rank that imports torch), which
    is why the launch runs it in a background thread while it builds data and rewards (after starting Ray itself
    on its own thread, ``owns_ray``: see :class:`RuntimeStart`); the models are loaded afterwards by
    :func:`init_models`, once the LR horizon is known. On failure everything started so far is released before
    the error propagates, so no Ray instance or worker is left behind.
    """
    from hybridflow.trainer.stages import WorkerGroups

    use_gpu = resolve_device(config) == "cuda"
    runtime = Runtime(groups=WorkerGroups(actor_rollout=None), n_devices=0, dp_size=0)
    try:
        if config.trainer.backend == "ray":  # first: the worker-class imports need no Ray, Ray's start is the long pole
            _start_ray(config, owns_ray, runtime)
        pool = _trainer_pool(config, use_gpu, runtime)
        views, colocated_teachers = _colocated_host(config, pool, runtime)
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
    runtime.n_devices = pool.world_size
    # the batch is dispatched over the actor's data-parallel groups (tp / pp / sp peers share rows): balance over them
    runtime.dp_size = data_parallel_size(config, "actor_rollout_ref.actor") if pool.world_size > 1 else 1
    return runtime


def _start_ray(config, owns_ray: bool, runtime: Runtime) -> None:
    import ray

    from hybridflow.controller.ray_init import init_ray

    started_here = owns_ray or not ray.is_initialized()  # owns_ray: the caller started it for this run
    init_ray(dict(config.ray_kwargs.ray_init))
    if started_here:
        runtime._closers.append(ray.shutdown)


def _trainer_pool(config, use_gpu: bool, runtime: Runtime):
    """The trainer pool: ``trainer.nnodes x n_gpus_per_node`` processes (one in this process with ``local``)."""
    from hybridflow.controller import create_resource_pool

    tcfg = config.trainer
    process_on_nodes = [1] if tcfg.backend == "local" else [tcfg.n_gpus_per_node] * tcfg.nnodes
    pool = create_resource_pool(tcfg.backend, process_on_nodes, use_gpu=use_gpu, **pool_options(config))
    release = getattr(pool, "release", None)
    if callable(release):
        runtime._closers.append(release)
    return pool


def _colocated_host(config, pool, runtime: Runtime) -> tuple[dict[str, Any], dict]:
    """HybridFlow's colocated placement: every role lives in the same process per device (actor+rollout+ref, critic,
    reward model, a colocated judge or teachers), so the models run one after another on the same devices and
    never wait for each other's resources. Returns the role views and the colocated teachers."""
    from hybridflow.agents.loop_manager import rollout_stream_threads
    from hybridflow.controller import ClassWithInitArgs, create_colocated_worker_cls, create_worker_group
    from hybridflow.rollout.service.replica import RAY_ROLLOUT_CONCURRENCY_GROUP
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    class_dict = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config.actor_rollout_ref,
                                                     _actor_role(config))}
    if config.use_critic:
        from hybridflow.workers.critic import CriticWorker

        class_dict["critic"] = ClassWithInitArgs(CriticWorker, config.critic)
    roles, colocated_teachers = extra_colocated_roles(config)  # reward model, judge, teachers
    class_dict.update(roles)
    host_cls = create_colocated_worker_cls(class_dict)
    # Rollout requests from the agent loops run in their own thread pool beside the dispatched calls.
    host_cls.concurrency_groups = {RAY_ROLLOUT_CONCURRENCY_GROUP: rollout_stream_threads(config)}
    host = create_worker_group(config.trainer.backend, pool, host_cls, role="colocated")
    runtime._closers.append(host.shutdown)
    return host.spawn(class_dict), colocated_teachers


def init_models(runtime: Runtime, total_training_steps: int | None = None, max_seq_len: int | None = None) -> None:
    """``init_model`` on every role, actor last; the trained roles get the LR horizon as an argument
    because their processes were started (and their config sent) before the dataset length was known, and the
    critic the data's longest sequence (its config has no lengths) for its activation checkpointing decision."""
    for role in _INIT_ORDER:
        if role == "actor_rollout" and runtime.groups.teachers is not None:  # distillation teachers: frozen models
            runtime.groups.teachers.init_models()
        view = runtime.views.get(role)
        if view is None:
            continue
        if role == "critic":
            view.init_model(total_training_steps=total_training_steps, max_seq_len=max_seq_len)
        else:
            view.init_model(total_training_steps=total_training_steps)  # PRIME's PRM trains: it needs the horizon


class RuntimeStart:
    """The worker start-up of a run: in a background thread for Ray, inline for ``local``.

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


def longest_sequence(config) -> int:
    """The data's prompt + response length: the longest sequence a training micro-batch row can have."""
    return int(config.data.max_prompt_length) + int(config.data.max_response_length)

