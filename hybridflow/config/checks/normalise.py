"""Deprecated spellings written into the keys the code reads (each noted once)."""

from __future__ import annotations

from hybridflow.config.schema import PPOConfig

__all__ = ["MIRRORS", "check_mirrors", "normalise_deprecated"]

# verl keeps copies of some keys in other nodes (interpolated from the original); a copy set to another value
# would mean two settings for one thing.
MIRRORS = (
    ("actor_rollout_ref.actor.rollout_n", "actor_rollout_ref.rollout.n"),
    ("actor_rollout_ref.ref.rollout_n", "actor_rollout_ref.rollout.n"),
    ("critic.rollout_n", "actor_rollout_ref.rollout.n"),
)


def _get(cfg, dotted: str):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_mirrors(cfg: PPOConfig, errors: list[str]) -> None:
    for copy, source in MIRRORS:
        if _get(cfg, copy) != _get(cfg, source):
            errors.append(f"{copy}={_get(cfg, copy)} but {source}={_get(cfg, source)}: {copy} is verl's copy of "
                          f"{source} (it follows it by default); set {source} and drop {copy}")


def normalise_deprecated(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """Deprecated spellings and verl 0.9's ``null`` defaults written into the values the code reads."""
    data = cfg.data
    if data.gen_batch_size is None:  # verl 0.9: null = one generation round per step
        data.gen_batch_size = data.train_batch_size
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.tensor_model_parallel_size is None:  # the engine's default: verl's 2 for the servers, hf unsplit
        rollout.tensor_model_parallel_size = 1 if rollout.name == "hf" else 2
    runtime_env = cfg.ray_kwargs.ray_init.get("runtime_env")
    if isinstance(runtime_env, dict):  # verl's scripts write runtime_env.py_executable=null: nothing to pass on
        runtime_env = {k: v for k, v in runtime_env.items() if v is not None}
        if runtime_env:
            cfg.ray_kwargs.ray_init["runtime_env"] = runtime_env
        else:
            cfg.ray_kwargs.ray_init.pop("runtime_env")
    # verl's tracker takes one bare backend name as well as a list (trainer.logger=console).
    if isinstance(cfg.trainer.logger, str):
        cfg.trainer.logger = [cfg.trainer.logger]
    # verl has two spellings of gradient clipping; the engine reads <role>.grad_clip.
    for key, role in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        if role.optim.clip_grad != 1.0 and role.grad_clip == 1.0:
            role.grad_clip = role.optim.clip_grad
            notes.append(f"{key}.optim.clip_grad={role.optim.clip_grad} is used as {key}.grad_clip")
    actor = cfg.actor_rollout_ref.actor
    # verl mirrors <role>.entropy_checkpointing into its engine's fsdp_config; either spelling turns it on
    actor.entropy_checkpointing = bool(actor.entropy_checkpointing or actor.fsdp_config.entropy_checkpointing)
    if actor.use_gpg_loss and actor.policy_loss.loss_mode in ("vanilla", "gpg"):
        actor.policy_loss.loss_mode = "gpg"
        notes.append("actor_rollout_ref.actor.use_gpg_loss is deprecated; using "
                     "actor_rollout_ref.actor.policy_loss.loss_mode=gpg")
    elif actor.use_gpg_loss:
        notes.append(f"actor_rollout_ref.actor.use_gpg_loss=true is ignored: policy_loss.loss_mode="
                     f"{actor.policy_loss.loss_mode} is set explicitly")
    for key, optim in (("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim),
                       ("critic.optim", cfg.critic.optim)):
        if optim.warmup_style is not None:
            notes.append(f"{key}.warmup_style is deprecated; using it as {key}.lr_scheduler_type={optim.warmup_style}")
            optim.lr_scheduler_type = optim.warmup_style
