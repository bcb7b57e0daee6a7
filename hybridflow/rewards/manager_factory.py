"""Building the reward manager from the verl-shaped config (``reward_model``, ``custom_reward_function``)."""

from __future__ import annotations

from typing import Any

from hybridflow.rewards.custom_function import ScoreFnSpec
from hybridflow.rewards.managers import REWARD_MANAGERS, RewardManager
from hybridflow.rewards.outcome import ScoringConfig

_DAPO_CTOR_KEYS = ("max_resp_len", "overlong_buffer_cfg")


def load_reward_manager(config, tokenizer, num_examine: int = 0, **reward_kwargs: Any) -> RewardManager:
    """Reward manager named by ``config.reward_model.reward_manager``.

    Reads ``config.custom_reward_function.{path,name}`` (null path = built-in scorers by data_source),
    ``config.data.reward_fn_key``, ``config.reward_model.{reward_kwargs,num_workers,timeout_s,error_score}``.
    ``max_resp_len`` / ``overlong_buffer_cfg`` in the kwargs configure the ``dapo`` manager (verl passes them
    the same way); all other kwargs are forwarded to every ``compute_score`` call.
    """
    rm = config.reward_model
    name = rm.reward_manager
    if name not in REWARD_MANAGERS:
        raise ValueError(f"reward_model.reward_manager: {REWARD_MANAGERS.unknown_message(name)}")
    kwargs = {**dict(rm.reward_kwargs or {}), **reward_kwargs}
    ctor = {k: kwargs.pop(k) for k in _DAPO_CTOR_KEYS if k in kwargs}
    if ctor and name != "dapo":
        raise ValueError(f"reward_model.reward_kwargs {sorted(ctor)} only apply to reward_manager=dapo, not '{name}'")
    crf = config.custom_reward_function
    spec = ScoreFnSpec(path=crf.path, name=crf.name) if crf.path else ScoreFnSpec()
    scoring = ScoringConfig(num_workers=rm.num_workers, timeout_s=rm.timeout_s, error_score=rm.error_score)
    cls = REWARD_MANAGERS.get(name)
    return cls(tokenizer, num_examine=num_examine, compute_score=spec, reward_fn_key=config.data.reward_fn_key,
               reward_kwargs=kwargs, scoring=scoring, **ctor)
