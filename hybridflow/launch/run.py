"""One run, built role by role: the launch path every entry point takes (``hybridflow train``, ``python -m
hybridflow.trainer.main_ppo``, verl's recipe and async entry points, the quickstarts, the Python API).

:func:`build_run` reads top to bottom:

1. the run-stage checks (files, device, output folders) unless the command line ran them;
2. the user modules of ``trainer.import_modules`` (every process started from here imports them too);
3. the worker processes, started in the background (Ray) while the driver builds
4. the tokenizer, processor, datasets and loaders, and the run length (mode, steps, LR horizon);
5. the reward functions (after the judge when scorers ask one);
6. the models, loaded with the LR horizon;
7. the rollout service over the replicas;
8. the logger, then the controller: the mode, the stage hooks, the plan.

:func:`train_ppo` is ``build_run`` -> ``fit`` -> release. The processes and services the run started are released
in reverse order by ``BuiltRun.close`` whatever happens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hybridflow.config.plan import plan_step
from hybridflow.launch.inputs import (
    build_data,
    build_logger,
    build_reward_fns,
    check_dataset_agent_names,
    load_processor_for,
    load_tokenizer_for,
)
from hybridflow.launch.judge import start_judge
from hybridflow.launch.processes import (Runtime, RuntimeStart, create_workers, init_models, longest_sequence,
                                         pool_options, resolve_device)
from hybridflow.launch.rollout_service import start_rollout_service
from hybridflow.trainer.controller import RLController, RunHistory
from hybridflow.trainer.hooks import hooks_for
from hybridflow.trainer.judge_service import JUDGE_ROLE, judge_enabled
from hybridflow.trainer.modes import mode_for, run_length

__all__ = ["BuiltRun", "build_run", "build_runtime", "start_judge_service", "train_ppo"]


@dataclass
class BuiltRun:
    """A run ready to ``fit``: the controller and what must be released after it."""

    config: Any = None
    controller: RLController | None = None
    runtime: Runtime | None = None
    reward_fns: list[Any] = field(default_factory=list)
    start: RuntimeStart | None = None

    def close(self) -> None:
        for fn in self.reward_fns:
            fn.close()
        if self.runtime is not None:
            _dump_ray_timeline(self.config)
            self.runtime.close()
        elif self.start is not None:
            self.start.abandon()


def train_ppo(config, logger=None, should_stop: Callable[[], bool] | None = None) -> RunHistory:
    """One training run; returns the metrics history (also sent to ``logger`` / ``trainer.logger``)."""
    run = BuiltRun()
    try:
        build_run(config, logger, into=run)
        return run.controller.fit(should_stop=should_stop)
    finally:
        run.close()


def build_run(config, logger=None, into: BuiltRun | None = None) -> BuiltRun:
    """Build the run of ``config`` (see the module docstring); on failure the caller's ``into.close()`` releases
    what was started."""
    import torch

    from hybridflow.launch.config import check_for_run, checked_for_run
    from hybridflow.utils.user_modules import export_user_modules, import_user_modules

    run = into if into is not None else BuiltRun()
    run.config = config
    tcfg = config.trainer
    if not checked_for_run(config):                                                                  # 1.
        check_for_run(config, logger_dir=logger.output_dir if logger is not None else None)
    export_user_modules(import_user_modules(tcfg.import_modules), config.ray_kwargs.ray_init)       # 2.
    run.start = RuntimeStart(config)                                                                  # 3.
    torch.manual_seed(tcfg.seed)
    tokenizer, processor = load_tokenizer_for(config), load_processor_for(config)                     # 4.
    train_loader, val_loader = build_data(config, tokenizer, processor)
    check_dataset_agent_names(train_loader, val_loader)
    total, scheduler_steps = run_length(config, len(train_loader))
    if not config.uses_judge:                                                                          # 5.
        run.reward_fns = list(build_reward_fns(config, tokenizer))
    run.runtime = run.start.result()
    init_models(run.runtime, scheduler_steps, longest_sequence(config))                                # 6.
    if config.uses_judge:  # (scorers that ask a judge need its router, started with the models)
        run.reward_fns = list(build_reward_fns(config, tokenizer, start_judge_service(config, run.runtime)))
    reward_fn, val_reward_fn = run.reward_fns
    start_rollout_service(run.runtime, config, tokenizer, reward_fn, processor)                       # 7.
    if logger is None:                                                                                 # 8.
        logger = build_logger(config, total)
    run.controller = RLController(config, tokenizer, run.runtime.groups, train_loader, val_loader, reward_fn,
                                  val_reward_fn, logger=logger, n_devices=run.runtime.n_devices,
                                  dp_size=run.runtime.dp_size, mode=mode_for(config, train_loader),
                                  hooks=hooks_for(config), plan=plan_step(config), total_training_steps=total)
    return run


def start_judge_service(config, runtime: Runtime):
    """The judge of ``reward_model.rollout.name`` (``None`` without one); stopped with the runtime."""
    if not judge_enabled(config):
        return None
    return start_judge(config, runtime.views.get(JUDGE_ROLE), resolve_device(config) == "cuda", runtime._closers,
                       pool_options(config))


def build_runtime(config, tokenizer=None, total_training_steps: int | None = None) -> Runtime:
    """Processes, models and rollout service without a controller (``hybridflow generate`` and tests that drive
    the workers themselves); released by ``Runtime.close``."""
    runtime = create_workers(config)
    try:
        init_models(runtime, total_training_steps, longest_sequence(config))
        start_rollout_service(runtime, config, tokenizer if tokenizer is not None else load_tokenizer_for(config))
    except BaseException:
        runtime.close()
        raise
    return runtime


def _dump_ray_timeline(config) -> None:
    """``ray_kwargs.timeline_json_file``: Ray's task timeline (chrome://tracing JSON) of the run, as verl writes it."""
    path = config.ray_kwargs.timeline_json_file
    if path and config.trainer.backend == "ray":
        import ray

        if ray.is_initialized():
            ray.timeline(filename=str(path))
