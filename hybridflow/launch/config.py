"""The configuration of a run: composed on the config floor, then checked by every floor's rules in one fixed order.

The check pipeline has two stages, each an ordered list of :class:`~hybridflow.config.checks.Check` (adding a rule
is one line in one of them). The rules live with the floor that knows what they check -- the config's own values in
``config/checks/``, the registries' names in ``algorithms/checks.py`` and ``rewards/checks.py``, the parallel
layout in ``engine/parallel/checks.py``, what an engine can serve in ``rollout/<engine>/checks.py`` -- and the order
lives here:

1. :data:`CONFIG_CHECKS` -- rules on the configuration itself, run by :func:`load_config` (every entry point, the
   Python API and the tests). They read no file except the user modules named by ``trainer.import_modules``
   (imported first, so names they register pass the name checks). Some write a deprecated spelling into the key
   the code reads (``normalise``, ``batch_sizes``, ``megatron``), so the order matters.
2. :data:`RUN_CHECKS` -- rules on the machine and the files the run will read (model ``config.json``, data row
   counts, reward function and dataset classes, agent-loop / tool / interaction files, output folders, the device),
   run by ``hybridflow train`` (``--dry-run`` included) and by the launch right before the first process starts.
   They read only what they need: no model weights, no Ray.

All of a stage's checks run, then the stage raises one ``ConfigError`` listing every problem.
"""

from __future__ import annotations

import os
from types import ModuleType

from hybridflow.agents.checks import check_agent_files
from hybridflow.algorithms.checks import check_algorithms
from hybridflow.config.checks import Check, RunContext, check_plan, run_checks
from hybridflow.config.checks.algorithms import check_group_size, check_rollout_correction
from hybridflow.config.checks.batch import check_batch_sizes, check_legacy_micro
from hybridflow.config.checks.distillation import check_distillation
from hybridflow.config.checks.drift import check_drift
from hybridflow.config.checks.exact import check_exact_log_probs
from hybridflow.config.checks.extensions import check_import_modules
from hybridflow.config.checks.judge import check_judge
from hybridflow.config.checks.machine import check_rollout_precision
from hybridflow.config.checks.engines import check_engines
from hybridflow.config.checks.megatron import check_megatron
from hybridflow.config.checks.normalise import check_mirrors, normalise_deprecated
from hybridflow.config.checks.outputs import check_output_dirs
from hybridflow.config.checks.parallel import check_sequence_parallel
from hybridflow.config.checks.placement import check_async_config
from hybridflow.config.checks.policy import check_inert_keys, check_refused_keys
from hybridflow.config.checks.ranges import check_value_ranges
from hybridflow.config.checks.recipes import check_recipes
from hybridflow.config.checks.rewards import check_async_reward
from hybridflow.config.checks.v1 import check_v1_config
from hybridflow.config.checks.values import check_choices, check_dtypes, check_sampling, check_schedules, check_strategies
from hybridflow.config.loader import compose_config
from hybridflow.config.modes import check_async_validation, check_mode
from hybridflow.config.schema import PPOConfig
from hybridflow.data.checks import check_data_files
from hybridflow.engine.checks import check_megatron_lora, check_model_files, check_optimizers, check_prompt_rows
from hybridflow.engine.model_loader import ModelLoadError, check_causal_lm
from hybridflow.engine.parallel.checks import check_parallel_layout, check_parallel_model
from hybridflow.rewards.checks import check_reward_manager, check_user_code
from hybridflow.rollout.hf import checks as hf_checks
from hybridflow.rollout.sglang import checks as sglang_checks
from hybridflow.rollout.vllm import checks as vllm_checks

__all__ = ["CONFIG_CHECKS", "PIPELINE", "RUN_CHECKS", "check_for_run", "checked_for_run", "load_config",
           "rollout_hardware_errors", "rollout_model_errors", "validate_config"]

# Stage 1, in order. Names registered by user modules must exist before names are checked, deprecated spellings
# are normalised before the values are read, placement normalises fully async batch sizes before the batch
# checks, and the plan is decided on the final sizes.
CONFIG_CHECKS: tuple[Check, ...] = (
    Check("import_modules", check_import_modules),      # trainer.import_modules / VERL_USE_EXTERNAL_MODULES
    Check("normalise", normalise_deprecated),           # deprecated spellings -> the keys the code reads
    Check("engines", check_engines),                    # verl's VeOmni / FSDP-Turbo / Megatron Lite / per-role engines
    Check("megatron_lora", check_megatron_lora),        # verl's model.lora node -> lora_rank / alpha / target_modules
    Check("megatron", check_megatron),                  # strategy=megatron: tp / ep / cp sizes, offload, refusals
    Check("parallel_layout", check_parallel_layout),    # the megatron sizes against the role's devices
    Check("mirrors", check_mirrors),                    # verl's copies of a key (actor.rollout_n, ...) agree
    Check("choices", check_choices),                    # enumerated values
    Check("value_ranges", check_value_ranges),          # numbers in their meaningful range (clip_ratio >= 0, ...)
    Check("strategies", check_strategies),              # fsdp / fsdp2 / megatron
    Check("dtypes", check_dtypes),
    Check("schedules", check_schedules),                # lr schedules
    Check("sampling", check_sampling),                  # training temperature
    Check("algorithms", check_algorithms),              # estimator / policy-loss names (registries)
    Check("rollout_correction", check_rollout_correction),
    Check("exact_log_probs", check_exact_log_probs),    # rollout.exact_log_probs: hf, calculate_log_probs, sp=1
    Check("drift", check_drift),                        # trainer.drift.*: levels and action of the drift detector
    Check("recipes", check_recipes),                    # SPIN / SPPO / PRIME keys (PRIME sets data.gen_batch_size)
    Check("distillation", check_distillation),          # teachers, their pools and the distillation loss
    Check("reward_manager", check_reward_manager),      # manager name (registry) or importlib source
    Check("judge", check_judge),                        # reward_model.rollout.* (a judge) and the RM's own pool
    Check("placement", check_async_config),             # split placement and async modes
    Check("v1_trainer", check_v1_config),               # trainer.use_v1 / trainer.v1.* (verl 0.9's V1 trainer)
    Check("mode", check_mode),                          # the keys name one controller mode (config/modes.py)
    Check("async_validation", check_async_validation),  # trainer.async_validation: modes whose replicas keep weights
    Check("batch_sizes", check_batch_sizes),            # prompts, trajectories, micro-batches per device
    Check("sequence_parallel", check_sequence_parallel),  # Ulysses sp sizes, heads, use_remove_padding
    Check("legacy_micro", check_legacy_micro),          # deprecated global micro-batch sizes
    Check("group_size", check_group_size),              # group estimators with rollout.n=1
    Check("plan", check_plan),                          # the step plan (StepPlan), ReMax's greedy baseline
    Check("async_reward", check_async_reward),
    Check("refused_keys", check_refused_keys),          # key_policy.REFUSED: features hybridflow does not have
    Check("inert_keys", check_inert_keys),              # key_policy.INERT: one note naming every inert key set
)

_ENGINE_CHECKS: dict[str, ModuleType] = {"hf": hf_checks, "vllm": vllm_checks, "sglang": sglang_checks}


def rollout_hardware_errors(cfg, device: str) -> list[str]:
    """Errors for rollout keys that cannot act on ``device`` (``"cpu"`` or ``"cuda"``): the engine's own rules."""
    engine = _ENGINE_CHECKS.get(cfg.actor_rollout_ref.rollout.name)
    return engine.device_errors(cfg, device) if engine is not None else []


def rollout_model_errors(cfg) -> list[str]:
    """Errors for a rollout engine that cannot serve ``actor_rollout_ref.model.path`` here (read from the folder)."""
    engine = _ENGINE_CHECKS.get(cfg.actor_rollout_ref.rollout.name)
    return engine.model_errors(cfg) if engine is not None else []


def check_rollout_hardware(cfg: PPOConfig, errors: list[str], notes: list[str], ctx: RunContext) -> None:
    """Rollout keys that cannot act on the device this run computes on (and keys that act differently there)."""
    errors.extend(rollout_hardware_errors(cfg, ctx.device))
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name != "hf" and rollout.free_weights_on_sleep is not None:
        errors.append(f"actor_rollout_ref.rollout.free_weights_on_sleep={rollout.free_weights_on_sleep} acts on the "
                      f"split hf engine only; {rollout.name}'s own sleep level decides what it frees (vLLM: level 2 "
                      "drops the weights unless LoRA is on). Remove the key")
    engine = _ENGINE_CHECKS.get(rollout.name)
    if engine is not None:
        notes.extend(engine.device_notes(cfg, ctx.device))


def check_rollout_model(cfg: PPOConfig, errors: list[str]) -> None:
    """The rollout engine can serve the actor's checkpoint (asked only of a checkpoint the engine can load: the
    ``model_files`` check reports the others)."""
    model = cfg.actor_rollout_ref.model
    try:
        check_causal_lm(model.path, model.trust_remote_code)
    except ModelLoadError:
        return
    errors.extend(rollout_model_errors(cfg))


# Stage 2, in order: the device first (it decides what the rollout can do), then what each file must hold.
RUN_CHECKS: tuple[Check, ...] = (
    Check("rollout_hardware", check_rollout_hardware),    # engine keys that cannot act on this device
    Check("rollout_precision", check_rollout_precision),  # pi_old from the rollout needs the training precision
    Check("model_files", check_model_files),              # config.json: a causal LM the engine can load
    Check("rollout_model", check_rollout_model),          # ... that the rollout engine can serve
    Check("exact_log_probs", hf_checks.resolve_exact_log_probs),  # exact where it can be (null), or say why not
    Check("parallel_model", check_parallel_model),        # strategy=megatron: tp / ep divide heads, MLP, experts
    Check("data_files", check_data_files),                # files exist, a step's prompts are there
    Check("prompt_rows", check_prompt_rows),              # row sizes; prompt lengths under truncation=error
    Check("user_code", check_user_code),                  # reward function + signature, classes, external_lib
    Check("optimizers", check_optimizers),                # optim.optimizer_impl / optimizer name a class
    Check("agent_files", check_agent_files),              # agent-loop / tool / interaction files
    Check("output_dirs", check_output_dirs),              # writable, room for the checkpoints kept
)

PIPELINE: tuple[Check, ...] = CONFIG_CHECKS + RUN_CHECKS


def validate_config(cfg: PPOConfig) -> list[str]:
    """Stage 1: raise ``ConfigError`` listing every problem; return the notes (also warned as ``ConfigWarning``)."""
    return run_checks(cfg, CONFIG_CHECKS)


def load_config(overrides: list[str] | None = None, config_path: str | None = None,
                config_name: str | None = None) -> PPOConfig:
    """Compose, resolve and type the trainer config (verl's key tree and Hydra grammar), then run stage 1.
    Raises ``ConfigError`` with every problem."""
    cfg = compose_config(overrides, config_path, config_name)
    validate_config(cfg)
    return cfg


def check_for_run(cfg: PPOConfig, logger_dir: str | os.PathLike | None = None) -> list[str]:
    """Stage 2 on a config that passed stage 1 (:func:`load_config`); raises ``ConfigError`` with every problem.
    Marks the config so a later caller (the launch after the command line ran it) does not repeat it."""
    notes = run_checks(cfg, RUN_CHECKS, RunContext(cfg, logger_dir=str(logger_dir) if logger_dir else None))
    cfg.__dict__["_checked_for_run"] = True
    return notes


def checked_for_run(cfg: PPOConfig) -> bool:
    return bool(cfg.__dict__.get("_checked_for_run"))
