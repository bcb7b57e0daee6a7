"""Reading a verl-style training command line: overrides -> a validated ``PPOConfig``, or exit code 2.

Shared by ``hybridflow train`` / ``python -m hybridflow.trainer.main_ppo`` and ``hybridflow generate``, so
every entry point reports a bad key, value or batch size the same way: one ``hybridflow: ...`` line per
problem naming the key and the fix, notes for accepted-but-inactive keys, and no traceback.
"""

from __future__ import annotations

import sys
import warnings

EXIT_CONFIG_ERROR = 2


def config_error_text(e) -> str:
    """A ``ConfigError`` as the user reads it: one problem on one line, several one per line."""
    return f"invalid configuration: {e.messages[0]}" if len(e.messages) == 1 else str(e)


def load_trainer_config(argv: list[str]):
    """Parse a verl-style command line into (PPOConfig, CommandLine); exits 2 with messages on error."""
    from hybridflow.config import ConfigError, ConfigWarning, parse_command_line
    from hybridflow.launch.config import load_config

    try:
        cl = parse_command_line(argv)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    except ConfigError as e:
        print(f"hybridflow: {config_error_text(e)}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG_ERROR) from None
    for w in caught:
        if issubclass(w.category, ConfigWarning):
            print(f"hybridflow: note: {w.message}", file=sys.stderr)
    return cfg, cl


def check_trainer_run(cfg) -> bool:
    """The check pipeline's run stage (files, device, output folders); prints its problems and returns False."""
    from hybridflow.config import ConfigError, ConfigWarning
    from hybridflow.launch.config import check_for_run

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            check_for_run(cfg)
    except ConfigError as e:
        print(f"hybridflow: {config_error_text(e)}", file=sys.stderr)
        return False
    for w in caught:
        if issubclass(w.category, ConfigWarning):
            print(f"hybridflow: note: {w.message}", file=sys.stderr)
    return True


def user_error_types() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the input is wrong" (their message names the field and the fix).

    The CLI prints these as one line and exits 2 instead of dumping a traceback; anything else is a bug or
    a runtime fault and keeps its traceback. Imported lazily: each lives beside the code that raises it.
    """
    from hybridflow.agents.setup_check import AgentConfigError
    from hybridflow.config import ConfigError
    from hybridflow.config.checks.outputs import PreflightError
    from hybridflow.data.io import DataFileError
    from hybridflow.data.prompts import PromptTooLongError
    from hybridflow.engine.model_loader import ModelLoadError
    from hybridflow.protocol import BatchSizeError
    from hybridflow.rewards.custom_function import RewardFunctionError
    from hybridflow.trainer.run_checkpoint import CheckpointError
    from hybridflow.utils.load_object import LoadObjectError

    return (DataFileError, PromptTooLongError, ModelLoadError, RewardFunctionError, CheckpointError, BatchSizeError,
            PreflightError, AgentConfigError, ConfigError, LoadObjectError)


def describe_batch_sizes(cfg) -> str:
    """One paragraph in plain words: what a step and a mini-batch contain, with the user's numbers."""
    from hybridflow.config import n_devices
    from hybridflow.config.checks.parallel import data_parallel_size

    actor = cfg.actor_rollout_ref.actor
    n = cfg.actor_rollout_ref.rollout.n
    devs = n_devices(cfg)
    dp = data_parallel_size(cfg, "actor_rollout_ref.actor")  # devices / Ulysses sp
    share = "per device" if dp == devs else \
        f"per data-parallel group of {devs // dp} devices, each holding 1/{devs // dp} of the tokens"
    tb, mb = cfg.data.train_batch_size, actor.ppo_mini_batch_size
    lines = [
        f"one step: {tb} prompts x rollout.n={n} = {tb * n} trajectories on {devs} device(s)",
        f"policy update: {max(1, tb // mb)} mini-batch(es) of {mb} prompts = {mb * n} trajectories "
        f"({mb * n // dp} {share}) x ppo_epochs={actor.ppo_epochs}",
    ]
    lines.extend(_describe_async(cfg))
    if actor.use_dynamic_bsz:
        lines.append(f"micro-batches: dynamic, up to {actor.ppo_max_token_len_per_gpu} tokens per device")
    else:
        unit = "device" if dp == devs else "data-parallel group"
        lines.append(f"micro-batches: {actor.ppo_micro_batch_size_per_gpu} trajectories per {unit}")
    return "\n".join("# " + line for line in lines)


def _describe_async(cfg) -> list[str]:
    at, pool = cfg.async_training, cfg.rollout
    lines = []
    if cfg.split_placement:
        replicas = 1 if cfg.trainer.backend == "local" else pool.nnodes * pool.n_gpus_per_node
        lines.append(f"rollout: {replicas} standalone replica(s) on a pool of their own (rollout.nnodes x "
                     "rollout.n_gpus_per_node), weights pushed by the checkpoint engine")
    if at.mode == "one_step_off":
        lines.append("one-step-off: batch k+1 is generated while batch k trains; samples are one update old")
    elif at.mode == "fully_async":
        per_version = cfg.data.train_batch_size * at.trigger_parameter_sync_step
        budget = int(per_version * (1 + at.staleness_threshold))
        stale = -(-(budget - per_version) // per_version)
        lines.append(f"fully async: weights pushed every {at.trigger_parameter_sync_step} step(s) ({per_version} "
                     f"prompts per version); the rollouter may start {budget} per version, so samples are at most "
                     f"{stale} version(s) old (partial_rollout={at.partial_rollout})")
    return lines


__all__ = ["EXIT_CONFIG_ERROR", "check_trainer_run", "config_error_text", "describe_batch_sizes", "load_trainer_config",
           "user_error_types"]
