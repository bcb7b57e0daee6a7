"""This floor's configuration rules, run by the launch's check pipeline (run stage): the model folders hold models the
engine can load, and the optimizer the config names exists. Reads ``config.json`` and imports the optimizer module;
no weights load."""

from __future__ import annotations

from hybridflow.engine.model_loader import ModelLoadError, check_causal_lm, load_hf_config
from hybridflow.engine.optim import optimizer_class

__all__ = ["check_model_files", "check_optimizers"]


def check_model_files(cfg, errors: list[str]) -> None:
    """The actor's checkpoint is a causal LM (or a supported vision-language model); the critic's and the reward
    model's folders hold a model config. Reads ``config.json`` only (what the rollout engine can serve is the
    engine's own check)."""
    model = cfg.actor_rollout_ref.model
    try:
        check_causal_lm(model.path, model.trust_remote_code)
    except ModelLoadError as e:
        errors.append(str(e))
        return
    others = []
    if cfg.use_critic:
        others.append(("critic.model.path", cfg.critic.model.path, cfg.critic.model.trust_remote_code))
    if cfg.reward_model.enable:
        rm = cfg.reward_model.model
        others.append(("reward_model.model.path", rm.path, rm.trust_remote_code))
    for key, path, remote in others:
        try:
            load_hf_config(path, remote, None, key)
        except ModelLoadError as e:
            errors.append(str(e))


def check_optimizers(cfg, errors: list[str]) -> None:
    """``optim.optimizer_impl`` imports and ``optim.optimizer`` names an optimizer class in it (actor; critic when
    there is one) -- the engine's own rule (``engine/optim.py``), asked before any worker builds one."""
    roles = [("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim)]
    if cfg.use_critic:
        roles.append(("critic.optim", cfg.critic.optim))
    for field, optim in roles:
        try:
            optimizer_class(optim, field)
        except ValueError as e:
            errors.append(str(e))
