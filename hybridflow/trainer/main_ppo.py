"""verl-compatible entry point: ``python -m hybridflow.trainer.main_ppo key=value ...``.

``main`` reads the command line through the check pipeline and turns failures into exit codes; ``train_ppo`` is
one run, top to bottom: the run-stage checks, the worker processes started (``trainer/runtime.py``; with Ray in
the background) while the driver builds tokenizer, data and reward managers (``trainer/run_inputs.py``), the
models loaded with the LR horizon, the rollout service started, then the controller of ``async_training.mode``
(the synchronous HybridFlow step in ``ppo_trainer.py`` or an asynchronous one) runs ``fit()``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

# Heavy modules (torch, the trainer) are imported inside the functions that run a job, so that
# ``hybridflow train --dry-run``, which enters through ``main``, answers without loading them (the two modules
# below import nothing heavy at their top).
from hybridflow.trainer.run_inputs import (
    build_data,
    build_logger,
    build_reward_fns,
    check_dataset_agent_names,
    load_processor_for,
    load_tokenizer_for,
)
from hybridflow.trainer.runtime import RuntimeStart, init_models, start_judge_service, start_rollout_service

if TYPE_CHECKING:
    from hybridflow.trainer.ppo_trainer import RunHistory


V1_TRAINERS = {  # verl 0.9's trainer.v1.trainer_mode -> controller (module, class)
    "sync": ("hybridflow.trainer.asynchronous.v1_sync", "V1SyncTrainer"),
    "colocate_async": ("hybridflow.trainer.asynchronous.colocate_async", "V1ColocateAsyncTrainer"),
    "separate_async": ("hybridflow.trainer.asynchronous.separate_async", "V1SeparateAsyncTrainer"),
}


def trainer_class(config) -> type:
    """The controller of ``trainer.v1.trainer_mode`` (with ``trainer.use_v1=true``) or of ``async_training.mode``:
    the synchronous HybridFlow step, one-step-off or fully async; ``trainer.recipe`` spin / prime swap the
    synchronous step's stages (SPPO needs only its estimator and loss)."""
    from hybridflow.config.v1 import v1_mode

    v1 = v1_mode(config)
    if v1 is not None:
        import importlib

        module, name = V1_TRAINERS[v1]
        return getattr(importlib.import_module(module), name)
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

    from hybridflow.config.checks.run_stage import check_for_run, checked_for_run
    from hybridflow.trainer.ppo_trainer import lr_horizon, resolve_total_training_steps
    from hybridflow.utils.user_modules import export_user_modules, import_user_modules

    tcfg = config.trainer
    # The check pipeline's run stage (files, device, output folders) before any process starts -- unless the
    # command line already ran it.
    if not checked_for_run(config):
        check_for_run(config, logger_dir=logger.output_dir if logger is not None else None)
    # trainer.import_modules: every process started from here imports them too (Ray workers included)
    export_user_modules(import_user_modules(tcfg.import_modules), config.ray_kwargs.ray_init)
    # Workers start first (Ray: in the background) and the driver builds data and rewards meanwhile.
    start = RuntimeStart(config)
    runtime = None
    reward_fns: list = []
    try:
        torch.manual_seed(tcfg.seed)
        tokenizer = load_tokenizer_for(config)
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
        init_models(runtime, lr_horizon(config, total))
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
    from hybridflow.trainer.command_line import (
        EXIT_CONFIG_ERROR,
        check_trainer_run,
        describe_batch_sizes,
        load_trainer_config,
        user_error_types,
    )
    from hybridflow.utils.quiet import quiet_libraries

    quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    from hybridflow.cli.help import train_help, wants_help

    if wants_help(argv):  # --help [NODE]: options and config groups, or a node's keys with defaults
        return train_help(argv)
    cfg, cl = load_trainer_config(argv)
    if not check_trainer_run(cfg):  # the pipeline's run stage: files, device, output folders
        return EXIT_CONFIG_ERROR
    if cl.dry_run:
        from omegaconf import OmegaConf

        from hybridflow.config import config_to_dict

        print(OmegaConf.to_yaml(OmegaConf.create(config_to_dict(cfg))), end="")
        print(describe_batch_sizes(cfg))
        print("\n".join(f"# {line}" for line in cfg.plan.describe()))
        print("# dry run: configuration is valid (every check of the pipeline passed); nothing was loaded or trained")
        return 0
    from hybridflow.trainer.signals import GracefulInterrupt
    from hybridflow.trainer.step_failures import StepFailedError

    try:
        with GracefulInterrupt() as interrupt:  # Ctrl-C: finish the step, checkpoint, report, exit 130
            run_ppo(cfg, should_stop=interrupt.should_stop)
    except user_error_types() as e:  # bad input: one clear line, not a traceback
        print(f"hybridflow: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except rollout_failure_types() as e:  # an engine failed or a replica died: say which, and how to go on
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
    """Errors that mean the rollout side of the run failed: an engine raised, stalled or produced non-finite
    logits, a replica's process or an agent-loop worker died (their messages carry the cause)."""
    from hybridflow.rollout.base import EngineError
    from hybridflow.trainer.asynchronous.sample_queue import RolloutFailed

    return EngineError, RolloutFailed


if __name__ == "__main__":
    from hybridflow.utils.fast_exit import run_and_exit

    run_and_exit(main)
