"""Rewards: built-in scorers by ``data_source``, custom reward functions, and reward managers.

Exports are resolved lazily (PEP 562): scoring worker processes import this package, and must not pay for
torch / the managers just to run a rule scorer.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "default_compute_score": "hybridflow.rewards.scorers",
    "SCORERS": "hybridflow.rewards.scorers",
    "load_custom_reward_fn": "hybridflow.rewards.custom_function",
    "ScoreFnSpec": "hybridflow.rewards.custom_function",
    "RewardFunctionError": "hybridflow.rewards.custom_function",
    "ScoringConfig": "hybridflow.rewards.outcome",
    "REWARD_MANAGERS": "hybridflow.rewards.managers",
    "RewardManager": "hybridflow.rewards.managers",
    "NaiveRewardManager": "hybridflow.rewards.managers",
    "BatchRewardManager": "hybridflow.rewards.managers",
    "DAPORewardManager": "hybridflow.rewards.managers",
    "OverlongBufferConfig": "hybridflow.rewards.managers",
    "compute_reward": "hybridflow.rewards.managers",
    "load_reward_manager": "hybridflow.rewards.manager_factory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridflow.rewards' has no attribute '{name}'")
