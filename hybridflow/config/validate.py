"""Semantic checks on a typed config, with messages written for the person who made the mistake.

The rules themselves are the check pipeline (:mod:`hybridflow.config.checks`: one module per concern, one ordered
list per stage); :func:`validate_config` runs its configuration stage.  The batch-size rules follow verl's, but the
messages explain the vocabulary with the user's own numbers, because that vocabulary is verl's most common source
of confusion:

* ``data.train_batch_size`` and ``*.ppo_mini_batch_size`` count PROMPTS (global);
* each prompt yields ``rollout.n`` trajectories, so a step trains on train_batch_size x n sequences;
* ``*_per_gpu`` sizes are per device (per worker process on CPU) and count trajectories.

Warnings (accepted-but-unused keys, deprecated spellings) are collected and returned, not raised.
"""

from __future__ import annotations

from hybridflow.config.checks import CONFIG_CHECKS, ConfigWarning, n_devices, run_checks
from hybridflow.config.checks.values import DTYPE_NAMES, LOSS_AGG_MODES
from hybridflow.config.schema import PPOConfig

__all__ = ["ConfigWarning", "DTYPE_NAMES", "LOSS_AGG_MODES", "n_devices", "validate_config"]


def validate_config(cfg: PPOConfig) -> list[str]:
    """Run the configuration stage of the check pipeline: raise ``ConfigError`` listing every problem; return the
    notes (also emitted as :class:`ConfigWarning`)."""
    return run_checks(cfg, CONFIG_CHECKS)
