"""The single controller: the PPO/GRPO step as stages, validation, checkpoints, SFT and the quickstart.

Public entry points (resolved lazily so ``hybridflow merge`` does not import the whole trainer):

* ``run_ppo(config)`` / ``train_ppo(config, logger=None, should_stop=None) -> RunHistory`` (``main_ppo``)
* ``RLController`` (``controller``: the one loop, composed of a mode from ``modes/`` and hooks from ``hooks/``),
  ``WorkerGroups`` / ``StepPlan`` (``stages``)
* ``run_sft(config, rows=None)`` / ``load_sft_config(overrides)`` (``sft_trainer``)
* ``run_quickstart(output_dir, ...)`` (``quickstart``), ``merge_checkpoint(ckpt_dir, target_dir)`` (``merge``)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "run_ppo": "hybridflow.trainer.main_ppo",
    "train_ppo": "hybridflow.trainer.main_ppo",
    "RLController": "hybridflow.trainer.controller",
    "RunHistory": "hybridflow.trainer.controller",
    "WorkerGroups": "hybridflow.trainer.stages",
    "StepPlan": "hybridflow.trainer.stages",
    "run_sft": "hybridflow.sft.trainer",
    "load_sft_config": "hybridflow.sft.trainer",
    "run_quickstart": "hybridflow.quickstart.addition",
    "merge_checkpoint": "hybridflow.cli.merge",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridflow.trainer' has no attribute '{name}'")
