"""The check pipeline: every configuration rule, in one fixed order, before any process starts.

Two stages, each an ordered list of :class:`Check` (adding a rule is one line in one of them):

1. :data:`CONFIG_CHECKS` -- rules on the configuration itself (this module), run by ``load_config``: every
   entry point, the Python API and the tests see them.  They read no file except the user modules named by
   ``trainer.import_modules`` (imported first, so names they register pass the name checks).
2. :data:`hybridflow.config.checks.run_stage.RUN_CHECKS` -- rules on the machine and the files the run will read
   (model ``config.json``, data row counts, reward function and dataset classes, agent-loop / tool / interaction
   files, output folders, the device), run by ``hybridflow train`` (``--dry-run`` included) and ``train_ppo``
   right before the first process starts.  They read only what they need: no model weights, no Ray.

Each check is ``fn(cfg, errors, notes)`` (``fn(cfg, errors)`` is fine when it has nothing to note;
run-stage checks may take a fourth argument, the :class:`RunContext`).  A check appends one message per
problem naming the key and the fix; all of a stage's checks run, then the stage raises one ``ConfigError``
listing every problem.  Checks may write a deprecated spelling into the key the code reads (the
``normalise`` and ``batch`` checks do), so the order matters and is fixed here.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.config.checks.algorithms import check_algorithms, check_group_size, check_rollout_correction
from hybridflow.config.checks.batch import check_batch_sizes, check_legacy_micro, n_devices
from hybridflow.config.checks.distillation import check_distillation
from hybridflow.config.checks.exact import check_exact_log_probs
from hybridflow.config.checks.extensions import check_import_modules
from hybridflow.config.checks.judge import check_judge
from hybridflow.config.checks.megatron import check_megatron
from hybridflow.config.checks.normalise import check_mirrors, normalise_deprecated
from hybridflow.config.checks.parallel import check_sequence_parallel
from hybridflow.config.checks.placement import check_async_config
from hybridflow.config.checks.policy import check_inert_keys, check_refused_keys
from hybridflow.config.checks.ranges import check_value_ranges
from hybridflow.config.checks.recipes import check_recipes
from hybridflow.config.checks.rewards import check_async_reward, check_reward_manager
from hybridflow.config.checks.v1 import check_v1_config
from hybridflow.config.checks.values import (
    check_choices,
    check_dtypes,
    check_sampling,
    check_schedules,
    check_strategies,
)
from hybridflow.config.errors import ConfigError

__all__ = ["CONFIG_CHECKS", "Check", "ConfigWarning", "RunContext", "check_plan", "n_devices", "run_checks"]


class ConfigWarning(UserWarning):
    """A key hybridflow accepts for verl compatibility but does not act on, or a deprecated spelling."""


@dataclass(frozen=True)
class Check:
    """One rule of the pipeline: a name (shown by ``--dry-run``) and the function that applies it."""

    name: str
    fn: Callable[..., None]

    def __call__(self, cfg, errors: list[str], notes: list[str], ctx: "RunContext | None" = None) -> None:
        arity = len(inspect.signature(self.fn).parameters)
        args = (cfg, errors, notes, ctx)[:max(2, min(arity, 4))]
        self.fn(*args)


@dataclass
class RunContext:
    """What the run stage knows besides the config: where the logger writes, and the device (resolved lazily)."""

    cfg: Any
    logger_dir: str | None = None
    _device: str | None = None

    @property
    def device(self) -> str:
        if self._device is None:
            from hybridflow.config.checks.machine import resolve_device

            self._device = resolve_device(self.cfg)
        return self._device


def check_plan(cfg, errors: list[str]) -> None:
    """Decide the step plan once (where pi_old comes from, which stages run) and keep it on the config."""
    from hybridflow.config.plan import plan_step

    try:
        cfg.plan = plan_step(cfg)
    except ValueError as e:
        errors.append(str(e))


# Stage 1, in order. Names registered by user modules must exist before names are checked, deprecated spellings
# are normalised before the values are read, placement normalises fully async batch sizes before the batch
# checks, and the plan is decided on the final sizes.
CONFIG_CHECKS: tuple[Check, ...] = (
    Check("import_modules", check_import_modules),      # trainer.import_modules / VERL_USE_EXTERNAL_MODULES
    Check("normalise", normalise_deprecated),           # deprecated spellings -> the keys the code reads
    Check("megatron", check_megatron),                  # strategy=megatron: tp / ep / cp sizes, offload, refusals
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
    Check("recipes", check_recipes),                    # SPIN / SPPO / PRIME keys (PRIME sets data.gen_batch_size)
    Check("distillation", check_distillation),          # teachers, their pools and the distillation loss
    Check("reward_manager", check_reward_manager),      # manager name (registry) or importlib source
    Check("judge", check_judge),                        # reward_model.rollout.* (a judge) and the RM's own pool
    Check("placement", check_async_config),             # split placement and async modes
    Check("v1_trainer", check_v1_config),               # trainer.use_v1 / trainer.v1.* (verl 0.9's V1 trainer)
    Check("batch_sizes", check_batch_sizes),            # prompts, trajectories, micro-batches per device
    Check("sequence_parallel", check_sequence_parallel),  # Ulysses sp sizes, heads, use_remove_padding
    Check("legacy_micro", check_legacy_micro),          # deprecated global micro-batch sizes
    Check("group_size", check_group_size),              # group estimators with rollout.n=1
    Check("plan", check_plan),                          # the step plan (StepPlan), ReMax's greedy baseline
    Check("async_reward", check_async_reward),
    Check("refused_keys", check_refused_keys),          # key_policy.REFUSED: features hybridflow does not have
    Check("inert_keys", check_inert_keys),              # key_policy.INERT: one note naming every inert key set
)


def run_checks(cfg, checks: tuple[Check, ...], ctx: RunContext | None = None) -> list[str]:
    """Run ``checks`` in order; raise ``ConfigError`` listing every problem, else warn each note and return them."""
    errors: list[str] = []
    notes: list[str] = []
    for check in checks:
        check(cfg, errors, notes, ctx)
    if errors:
        raise ConfigError(errors)
    for note in notes:
        warnings.warn(note, ConfigWarning, stacklevel=3)
    return notes
