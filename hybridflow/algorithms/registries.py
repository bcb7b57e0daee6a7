"""The two algorithm extension points: advantage estimators and policy losses.

Both are :class:`hybridflow.utils.registry.Registry` instances behind verl's function names
(``register_adv_est`` / ``get_adv_estimator_fn``, ``register_policy_loss`` / ``get_policy_loss_fn``) so
a custom estimator or loss written for verl registers here unchanged::

    @register_adv_est("my_adv")
    def my_adv(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        ...
        return advantages, returns

An unknown name raises :class:`UnknownAlgorithmError` (a ``ValueError`` as in verl, and a ``KeyError``
for dict-style callers) whose message lists what is registered and the closest spelling.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable

from hybridflow.utils.registry import Registry

__all__ = [
    "AdvantageEstimator",
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "UnknownAlgorithmError",
    "register_adv_est",
    "get_adv_estimator_fn",
    "register_policy_loss",
    "get_policy_loss_fn",
]


class AdvantageEstimator(str, Enum):
    """Names of the built-in estimators (``algorithm.adv_estimator``); plain strings work too."""

    GAE = "gae"
    GRPO = "grpo"
    GRPO_PASSK = "grpo_passk"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"


class UnknownAlgorithmError(ValueError, KeyError):
    """An estimator / loss name that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise print the message quoted
        return str(self.args[0]) if self.args else ""


ADV_ESTIMATOR_REGISTRY: Registry[Callable[..., Any]] = Registry("advantage estimator")
POLICY_LOSS_REGISTRY: Registry[Callable[..., Any]] = Registry("policy loss")


def _lookup(registry: Registry, name: Any, config_key: str):
    if name not in registry:
        key = getattr(name, "value", name)
        raise UnknownAlgorithmError(f"{registry.unknown_message(key)} (set {config_key})")
    return registry.get(name)


def register_adv_est(name_or_enum: str | AdvantageEstimator, *, override: bool = False):
    """Decorator registering an advantage estimator under a name (str or :class:`AdvantageEstimator`)."""
    return ADV_ESTIMATOR_REGISTRY.register(name_or_enum, override=override)


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable[..., Any]:
    return _lookup(ADV_ESTIMATOR_REGISTRY, name_or_enum, "algorithm.adv_estimator")


def register_policy_loss(name: str, *, override: bool = False):
    """Decorator registering a policy loss ``fn(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)``."""
    return POLICY_LOSS_REGISTRY.register(name, override=override)


def get_policy_loss_fn(name: str) -> Callable[..., Any]:
    return _lookup(POLICY_LOSS_REGISTRY, name, "actor_rollout_ref.actor.policy_loss.loss_mode")
