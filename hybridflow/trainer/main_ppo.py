"""verl-compatible entry point: ``python -m hybridflow.trainer.main_ppo key=value ...``.

``main`` is parse -> build -> fit -> exit code: the command line through the check pipeline (``--dry-run`` stops
there), the run built role by role (``hybridflow/launch/run.py``), ``fit``, and every failure turned into one
line and an exit code. ``train_ppo(config)`` / ``run_ppo(config)`` are the same run from Python.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

# Heavy modules (torch, the launch, the trainer) are imported inside the functions that run a job, so that
# ``hybridflow train --dry-run``, which enters through ``main``, answers without loading them.

if TYPE_CHECKING:
    from hybridflow.trainer.controller import RunHistory

__all__ = ["main", "run_ppo", "train_ppo", "rollout_failure_types"]


def train_ppo(config, logger=None, should_stop: Callable[[], bool] | None = None) -> RunHistory:
    """One training run; returns the metrics history (also sent to ``logger`` / ``trainer.logger``)."""
    from hybridflow.launch.run import train_ppo as launch_train

    return launch_train(config, logger=logger, should_stop=should_stop)


def run_ppo(config, should_stop: Callable[[], bool] | None = None) -> None:
    """verl's entry: one training run from a loaded ``PPOConfig`` (see ``train_ppo`` for the history)."""
    train_ppo(config, should_stop=should_stop)


def main(argv: list[str] | None = None) -> int:
    """``hybridflow train`` / ``python -m hybridflow.trainer.main_ppo``: verl overrides, ``--config-path/--config-name``
    and ``--dry-run`` (print the resolved config and the batch sizes in words, load nothing)."""
    from hybridflow.launch.command_line import EXIT_CONFIG_ERROR, check_trainer_run, load_trainer_config
    from hybridflow.utils.quiet import quiet_libraries

    quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    from hybridflow.cli.help import train_help, wants_help

    if wants_help(argv):  # --help [NODE]: options and config groups, or a node's keys with defaults
        return train_help(argv)
    cfg, cl = load_trainer_config(argv)                                              # parse (the config checks)
    if not check_trainer_run(cfg):  # the pipeline's run stage: files, device, output folders
        return EXIT_CONFIG_ERROR
    if cl.dry_run:
        return _describe_dry_run(cfg)
    return _train_with_exit_code(cfg)                                                  # build -> fit -> exit code


def _describe_dry_run(cfg) -> int:
    from omegaconf import OmegaConf

    from hybridflow.config import config_to_dict
    from hybridflow.config.plan import plan_step
    from hybridflow.launch.command_line import describe_batch_sizes

    print(OmegaConf.to_yaml(OmegaConf.create(config_to_dict(cfg))), end="")
    print(describe_batch_sizes(cfg))
    print("\n".join(f"# {line}" for line in plan_step(cfg).describe()))
    print("# dry run: configuration is valid (every check of the pipeline passed); nothing was loaded or trained")
    return 0


def _train_with_exit_code(cfg) -> int:
    """The run; a failure becomes one line naming its cause and the exit code of its kind."""
    from hybridflow.launch.command_line import EXIT_CONFIG_ERROR, user_error_types
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
        hint = getattr(e, "hint", None) or (  # e.g. the drift detector's (trainer/drift.py)
            "the failure counts of the step are in the metrics log and the run report; raise "
            f"trainer.tolerated_failure_fraction (now {cfg.trainer.tolerated_failure_fraction:g}) only if partial "
            "failures are expected")
        print(f"hybridflow: {e}\nhybridflow: {hint}", file=sys.stderr)
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
