"""verl-compatible entry point: ``python -m hybridflow.trainer.main_ppo key=value ...``.

``run_ppo(config)`` wires one run: Ray (a lean local instance unless ``ray_kwargs.ray_init.address`` names a
cluster) or the in-process ``local`` backend, the resource pool (``trainer.nnodes x trainer.n_gpus_per_node``
devices; on CPU one process per "device" with one torch thread each so N workers never oversubscribe N
cores), the worker groups (actor+rollout+ref colocated in one process per device; critic and reward model
as their own groups on the same pool), tokenizer, datasets, reward managers -- then ``PPOTrainer.fit()``.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

# Heavy modules (torch, the trainer) are imported inside the functions that run a job, so that
# ``hybridflow train --dry-run``, which enters through ``main``, answers without loading them.
if TYPE_CHECKING:
    from hybridflow.trainer.ppo_trainer import RunHistory
    from hybridflow.trainer.stages import WorkerGroups


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


def create_workers(config) -> Runtime:
    """Start the backend and the role worker processes, without loading any model yet.

    With Ray this is the slow part of start-up (``ray.init``, then one process per rank that imports torch),
    which is why :func:`train_ppo` runs it in a background thread while it builds data and rewards; the
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

            started_here = not ray.is_initialized()
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
        from hybridflow.trainer.judge_service import JUDGE_ROLE, judge_enabled, judge_worker_config

        rm = config.reward_model
        if judge_enabled(config):  # a generative RM on the rollout service; colocated: a role of this host
            if rm.rollout.name == "hf" and not rm.enable_resource_pool:
                from hybridflow.workers.rollout_server_worker import RolloutServerWorker

                class_dict[JUDGE_ROLE] = ClassWithInitArgs(RolloutServerWorker, judge_worker_config(config))
        elif rm.enable and not rm.enable_resource_pool:
            class_dict["reward_model"] = reward_model_class(config)
        from hybridflow.trainer.teachers import colocated_teacher_roles

        colocated_teachers = colocated_teacher_roles(config)  # distillation teachers in the actor's processes
        for role, (teacher_cfg, _) in colocated_teachers.items():
            class_dict[role] = ClassWithInitArgs(ActorRolloutRefWorker, teacher_cfg, "ref")
        host_cls = create_colocated_worker_cls(class_dict)
        # Rollout requests from the agent loops run in their own thread pool beside the dispatched calls.
        host_cls.concurrency_groups = {RAY_ROLLOUT_CONCURRENCY_GROUP: rollout_stream_threads(config)}
        host = create_worker_group(backend, pool, host_cls, role="colocated")
        runtime._closers.append(host.shutdown)
        views = host.spawn(class_dict)
        teachers = teacher_groups(config, views, colocated_teachers, use_gpu, runtime._closers)
        if rm.enable and rm.enable_resource_pool and not judge_enabled(config):  # the RM on a pool of its own
            views["reward_model"] = reward_model_pool(config, use_gpu, runtime._closers)
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


def reward_model_class(config):
    """The reward-model role: a sequence-classification RM, or PRIME's implicit PRM (``trainer.recipe=prime``)."""
    from hybridflow.controller import ClassWithInitArgs

    if config.trainer.recipe == "prime":
        from hybridflow.workers.prime_rm import PrimeRewardModelWorker

        return ClassWithInitArgs(PrimeRewardModelWorker, config.reward_model, config.actor_rollout_ref.model.path)
    from hybridflow.workers.reward_model import RewardModelWorker

    return ClassWithInitArgs(RewardModelWorker, config.reward_model)


def reward_model_pool(config, use_gpu: bool, closers: list):
    """``reward_model.enable_resource_pool``: the reward model's worker group on ``reward_model.nnodes x
    n_gpus_per_node`` processes of its own (one in this process with the local backend)."""
    from hybridflow.controller import create_resource_pool, create_worker_group

    rm, backend = config.reward_model, config.trainer.backend
    nodes = [1] if backend == "local" else [int(rm.n_gpus_per_node)] * int(rm.nnodes)
    kwargs = pool_options(config)
    if backend == "ray":
        kwargs["name_prefix"] = "hybridflow_reward_model_pool"
    pool = create_resource_pool(backend, nodes, use_gpu=use_gpu, **kwargs)
    release = getattr(pool, "release", None)
    if callable(release):
        closers.append(release)
    group = create_worker_group(backend, pool, reward_model_class(config), role="reward_model")
    closers.append(group.shutdown)
    return group


def teacher_groups(config, views: dict, colocated: dict, use_gpu: bool, closers: list):
    """The distillation teachers' router (``None`` without distillation): colocated roles or pools of their own."""
    if not config.distillation.enabled:
        return None
    from hybridflow.trainer.teachers import Teacher, TeacherRouter, start_teacher_pools

    teachers = [Teacher(entry, views[role]) for role, (_, entry) in colocated.items()]
    teachers += start_teacher_pools(config, use_gpu, closers, pool_options(config))
    return TeacherRouter(teachers, config.distillation.teacher_key)


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
        from hybridflow.trainer.rollout_pool import rollout_pool_devices

        actor = runtime.groups.actor_rollout
        fleet = VLLMServerFleet.from_config(config, lambda: actor.get_actor_weights()[0].items(),
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
        view.init_model(total_training_steps=total_training_steps)


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
    the two overlap. ``result()`` waits and re-raises a start-up error unchanged (the same
    ``RayInitError`` / ``ResourceUnavailableError`` / ``WorkerError`` a sequential start raises);
    ``abandon()`` is for the driver failing first: it waits for the thread (a ``ray.init`` cannot be
    interrupted) and releases whatever it started, so no Ray instance or worker outlives the run.

    The thread that ran ``ray.init`` stays parked until the runtime is closed: Ray starts its GCS and raylet
    with ``PR_SET_PDEATHSIG``, which Linux fires when the *thread* that forked them exits, so a thread that
    returned after ``ray.init`` would take the cluster down with it.
    """

    def __init__(self, config):
        self._runtime: Runtime | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        if config.trainer.backend == "ray":
            self._thread = threading.Thread(target=self._run, args=(config, True), name="hybridflow-startup",
                                            daemon=True)
            self._thread.start()
        else:  # in-process backend: nothing slow to overlap, and breakpoints stay in the main thread
            self._run(config, False)
            if self._error is not None:  # nothing runs concurrently here, so fail at once
                raise self._error

    def _run(self, config, linger: bool) -> None:
        try:
            self._runtime = create_workers(config)
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


def build_data(config, tokenizer, processor=None):
    """Train / validation datasets and loaders (``data.*``); validation is skipped without ``val_files``.

    ``processor``: the multimodal processor of a vision-language model (:func:`load_processor_for`).
    """
    from hybridflow.data.loaders import create_train_dataloader, create_val_dataloader
    from hybridflow.data.rl_dataset import create_rl_dataset

    train = create_rl_dataset(config.data.train_files, config.data, tokenizer, processor=processor, is_train=True)
    train_loader = create_train_dataloader(train, config.data)
    val_loader = None
    if config.data.val_files:
        val = create_rl_dataset(config.data.val_files, config.data, tokenizer, processor=processor, is_train=False)
        val_loader = create_val_dataloader(val, config.data)
    return train_loader, val_loader


def check_dataset_agent_names(*loaders) -> None:
    """Rows naming an agent loop nobody registered stop the run here, before any model loads."""
    from hybridflow.agents.setup_check import check_agent_names

    for loader in loaders:
        if loader is not None:
            check_agent_names(loader.dataset)


def build_reward_fns(config, tokenizer, judge=None):
    """Training manager (``num_examine=0``) and validation manager (``num_examine=1``), as verl; with a judge
    (``trainer/judge_service.py``) their functions are offered its client and wrapped to count its requests."""
    from hybridflow.rewards import load_reward_manager

    if judge is None:
        return load_reward_manager(config, tokenizer, num_examine=0), load_reward_manager(config, tokenizer, num_examine=1)
    from hybridflow.trainer.judge_service import JudgedRewardFn

    offered = judge.reward_kwargs()
    return tuple(JudgedRewardFn(load_reward_manager(config, tokenizer, num_examine=k, judge_kwargs=offered), judge)
                 for k in (0, 1))


def start_judge_service(config, runtime: Runtime):
    """The judge of ``reward_model.rollout.name`` (``None`` without one); stopped with the runtime."""
    from hybridflow.trainer.judge_service import JUDGE_ROLE, judge_enabled, start_judge

    if not judge_enabled(config):
        return None
    return start_judge(config, runtime.views.get(JUDGE_ROLE), resolve_device(config) == "cuda", runtime._closers,
                       pool_options(config))


def build_logger(config, total_steps: int):
    from hybridflow.config import config_to_dict
    from hybridflow.tracking import Tracking

    tcfg = config.trainer
    return Tracking(project_name=tcfg.project_name, experiment_name=tcfg.experiment_name,
                    default_backend=tcfg.logger, config=config_to_dict(config), total_steps=total_steps)


def load_tokenizer_for(config):
    from hybridflow.engine.model_loader import load_tokenizer

    model = config.actor_rollout_ref.model
    return load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                          field="actor_rollout_ref.model.path")


def load_processor_for(config):
    """The multimodal processor of ``actor_rollout_ref.model`` (``None`` for a text-only model)."""
    from hybridflow.engine.model_loader import load_processor

    model = config.actor_rollout_ref.model
    processor = load_processor(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                               field="actor_rollout_ref.model.path")
    return processor


def trainer_class(config) -> type:
    """The controller of ``async_training.mode``: the synchronous HybridFlow step, one-step-off or fully async;
    ``trainer.recipe`` spin / prime swap the synchronous step's stages (SPPO needs only its estimator and loss)."""
    if config.trainer.recipe == "spin":
        from hybridflow.trainer.spin import SpinTrainer

        return SpinTrainer
    if config.trainer.recipe == "prime":
        from hybridflow.trainer.prime import PrimeTrainer

        return PrimeTrainer
    mode = config.async_training.mode
    if mode == "one_step_off":
        from hybridflow.trainer.asynchronous.one_step_off import OneStepOffTrainer

        return OneStepOffTrainer
    if mode == "fully_async":
        from hybridflow.trainer.asynchronous.fully_async import FullyAsyncTrainer

        return FullyAsyncTrainer
    from hybridflow.trainer.ppo_trainer import PPOTrainer

    return PPOTrainer


def run_ppo(config, should_stop: Callable[[], bool] | None = None) -> None:
    """verl's entry: one training run from a loaded ``PPOConfig`` (see ``train_ppo`` for the history)."""
    train_ppo(config, should_stop=should_stop)


def train_ppo(config, logger=None, should_stop: Callable[[], bool] | None = None) -> RunHistory:
    """One training run; returns the metrics history (also sent to ``logger`` / ``trainer.logger``)."""
    import torch

    from hybridflow.engine.model_loader import check_causal_lm
    from hybridflow.trainer.ppo_trainer import resolve_total_training_steps
    from hybridflow.trainer.preflight import run_preflight

    tcfg = config.trainer
    # Fail before any model loads: unwritable output folders, too little disk for checkpoints.
    logger_dir = logger.output_dir if logger is not None else Path("outputs") / tcfg.project_name / tcfg.experiment_name
    run_preflight(config, logger_dir=logger_dir)
    # Workers start first (Ray: in the background) and the driver builds data and rewards meanwhile.
    start = RuntimeStart(config)
    runtime = None
    reward_fns: list = []
    try:
        torch.manual_seed(tcfg.seed)
        tokenizer = load_tokenizer_for(config)
        model_cfg = config.actor_rollout_ref.model
        check_causal_lm(model_cfg.path, model_cfg.trust_remote_code)
        processor = load_processor_for(config)
        train_loader, val_loader = build_data(config, tokenizer, processor)
        check_dataset_agent_names(train_loader, val_loader)
        # The workers' LR schedules need the horizon; it is passed to init_model below.
        total = resolve_total_training_steps(config, len(train_loader))
        judged = config.uses_judge
        if not judged:  # (scorers that ask a judge need its router, started with the workers)
            reward_fn, val_reward_fn = build_reward_fns(config, tokenizer)
            reward_fns = [reward_fn, val_reward_fn]
        runtime = start.result()
        init_models(runtime, total)
        if judged:
            reward_fn, val_reward_fn = build_reward_fns(config, tokenizer, start_judge_service(config, runtime))
            reward_fns = [reward_fn, val_reward_fn]
        start_rollout_service(runtime, config, tokenizer, reward_fn, processor)
        if logger is None:
            logger = build_logger(config, total)
        trainer = trainer_class(config)(config, tokenizer, runtime.groups, train_loader, val_loader, reward_fn,
                                        val_reward_fn, logger=logger, n_devices=runtime.n_devices,
                                        dp_size=runtime.dp_size)
        return trainer.fit(should_stop=should_stop)
    finally:
        for fn in reward_fns:
            fn.close()
        if runtime is not None:
            dump_ray_timeline(config)
            runtime.close()
        else:
            start.abandon()


def dump_ray_timeline(config) -> None:
    """``ray_kwargs.timeline_json_file``: Ray's task timeline (chrome://tracing JSON) of the run, as verl writes it."""
    path = config.ray_kwargs.timeline_json_file
    if path and config.trainer.backend == "ray":
        import ray

        if ray.is_initialized():
            ray.timeline(filename=str(path))


def main(argv: list[str] | None = None) -> int:
    """``hybridflow train`` / ``python -m hybridflow.trainer.main_ppo``: verl overrides, ``--config-path/--config-name``
    and ``--dry-run`` (print the resolved config and the batch sizes in words, load nothing)."""
    from hybridflow.trainer.command_line import EXIT_CONFIG_ERROR, describe_batch_sizes, load_trainer_config
    from hybridflow.utils.quiet import quiet_libraries

    quiet_libraries()
    cfg, cl = load_trainer_config(list(sys.argv[1:] if argv is None else argv))
    if cl.dry_run:
        from omegaconf import OmegaConf

        from hybridflow.config import config_to_dict

        print(OmegaConf.to_yaml(OmegaConf.create(config_to_dict(cfg))), end="")
        print(describe_batch_sizes(cfg))
        print("# dry run: configuration is valid; nothing was loaded or trained")
        return 0
    from hybridflow.trainer.preflight import user_error_types
    from hybridflow.trainer.signals import GracefulInterrupt
    from hybridflow.trainer.step_failures import StepFailedError

    try:
        with GracefulInterrupt() as interrupt:  # Ctrl-C: finish the step, checkpoint, report, exit 130
            run_ppo(cfg, should_stop=interrupt.should_stop)
    except user_error_types() as e:  # bad input: one clear line, not a traceback
        print(f"hybridflow: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except rollout_failure_types() as e:  # a rollout replica died: say which, and how to go on
        print(f"hybridflow: {e}\nhybridflow: the run stopped; its last checkpoint (if any) under "
              f"{cfg.trainer.default_local_dir} is intact: fix the cause and run the same command again to resume "
              "from it (trainer.resume_mode=auto)", file=sys.stderr)
        return EXIT_ROLLOUT_FAILED
    except StepFailedError as e:  # too much of a step failed: the counts and the first error, not a traceback
        print(f"hybridflow: {e}\nhybridflow: the failure counts of the step are in the metrics log and the run report; "
              f"raise trainer.tolerated_failure_fraction (now {cfg.trainer.tolerated_failure_fraction:g}) only if "
              "partial failures are expected", file=sys.stderr)
        return EXIT_TRAINING_FAILED
    return interrupt.exit_code


EXIT_TRAINING_FAILED = 1


EXIT_ROLLOUT_FAILED = 3


def rollout_failure_types() -> tuple[type[BaseException], ...]:
    """Errors that mean the rollout side of the run died (a replica's process, an agent-loop worker)."""
    from hybridflow.rollout.service.replica import ReplicaError
    from hybridflow.trainer.asynchronous.sample_queue import RolloutFailed

    return ReplicaError, RolloutFailed


if __name__ == "__main__":
    sys.exit(main())
