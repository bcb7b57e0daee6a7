"""Batch and micro-batch sizes, explained with the user's own numbers (see ``validate.py`` for the vocabulary)."""

from __future__ import annotations

from hybridflow.config.checks.parallel import data_parallel_size, n_devices
from hybridflow.config.checks.values import _get
from hybridflow.config.schema import PPOConfig

__all__ = ["check_batch_sizes", "check_legacy_micro", "n_devices"]


def check_batch_sizes(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    data, arr = cfg.data, cfg.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    n, n_dev = rollout.n, n_devices(cfg)
    if n < 1:
        errors.append(f"actor_rollout_ref.rollout.n={n}: must be >= 1 (responses sampled per prompt)")
        return
    if n_dev < 1:
        errors.append(f"trainer.nnodes x trainer.n_gpus_per_node = {n_dev}: at least one device is needed")
        return
    if data.train_batch_size < 1 or actor.ppo_mini_batch_size < 1:
        errors.append("data.train_batch_size and actor_rollout_ref.actor.ppo_mini_batch_size must be >= 1")
        return
    # tensor-, pipeline- and sequence-parallel peers share their rows: the step is split over the actor's dp groups
    dp = data_parallel_size(cfg, "actor_rollout_ref.actor")
    groups = f"{dp} data-parallel group(s) of {n_dev} device(s)" if dp != n_dev else f"{n_dev} device(s)"
    vocab = (f"(data.train_batch_size={data.train_batch_size} prompts x rollout.n={n} = "
             f"{data.train_batch_size * n} trajectories per step, over {groups})")
    if (data.train_batch_size * n) % dp:
        errors.append(f"the {data.train_batch_size * n} trajectories of a step cannot be split evenly over "
                      f"{groups} {vocab}; make train_batch_size x rollout.n a multiple of the data-parallel size "
                      f"(trainer.nnodes x trainer.n_gpus_per_node / (pp x sp x tp))")
    if actor.ppo_mini_batch_size > data.train_batch_size:
        errors.append(f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} is larger than "
                      f"data.train_batch_size={data.train_batch_size}; both count prompts, and a step is cut into "
                      f"mini-batches of ppo_mini_batch_size prompts, so it must be <= train_batch_size")
    _check_micro(cfg, "actor_rollout_ref.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size,
                 actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz, "ppo_micro_batch_size", errors, notes)
    if cfg.use_critic:
        c = cfg.critic
        _check_micro(cfg, "critic", c.ppo_mini_batch_size, c.ppo_micro_batch_size, c.ppo_micro_batch_size_per_gpu,
                     c.use_dynamic_bsz, "ppo_micro_batch_size", errors, notes)
    for role, node in (("actor_rollout_ref.rollout", rollout), ("actor_rollout_ref.ref", arr.ref)):
        if node.log_prob_micro_batch_size is not None and node.log_prob_micro_batch_size_per_gpu is not None:
            errors.append(f"set only one of {role}.log_prob_micro_batch_size (deprecated, global) and "
                          f"{role}.log_prob_micro_batch_size_per_gpu")
        elif node.log_prob_micro_batch_size is not None:
            node.log_prob_micro_batch_size_per_gpu = max(1, node.log_prob_micro_batch_size // n_dev)
            notes.append(f"{role}.log_prob_micro_batch_size is deprecated (global); using "
                         f"{role}.log_prob_micro_batch_size_per_gpu={node.log_prob_micro_batch_size_per_gpu}")
        if node.log_prob_micro_batch_size_per_gpu is None and not node.log_prob_use_dynamic_bsz:
            node.log_prob_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu or 8


def check_legacy_micro(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """verl's deprecated global micro-batch sizes of the critic's forward pass and the reward model: divided by
    the device count into the ``*_per_gpu`` key each worker reads (as verl's workers do)."""
    n_dev = n_devices(cfg)
    pairs = [("reward_model", cfg.reward_model, "micro_batch_size")]
    if cfg.use_critic:
        pairs.insert(0, ("critic", cfg.critic, "forward_micro_batch_size"))
    for role, node, name in pairs:
        glob, per = getattr(node, name), getattr(node, f"{name}_per_gpu")
        if glob is None:
            continue
        if per is not None and not (role == "critic" and glob == node.ppo_micro_batch_size):
            errors.append(f"set only one of {role}.{name} (deprecated, global) and {role}.{name}_per_gpu")
            continue
        if per is None:
            setattr(node, f"{name}_per_gpu", max(1, glob // n_dev))
            notes.append(f"{role}.{name}={glob} is deprecated (global); using "
                         f"{role}.{name}_per_gpu={getattr(node, f'{name}_per_gpu')}")
    if cfg.use_critic and cfg.critic.forward_micro_batch_size_per_gpu is None and not cfg.critic.use_dynamic_bsz:
        cfg.critic.forward_micro_batch_size_per_gpu = cfg.critic.ppo_micro_batch_size_per_gpu


def _check_micro(cfg, role, mini, micro_global, micro_per_gpu, dynamic, name, errors, notes) -> None:
    # with sequence / tensor parallelism a mini-batch is split over the dp = devices / (sp x tp) groups
    n, n_dev = cfg.actor_rollout_ref.rollout.n, data_parallel_size(cfg, role)
    devices = "devices" if n_dev == n_devices(cfg) else \
        "data-parallel groups (devices / (ulysses_sequence_parallel_size x megatron.tensor_model_parallel_size))"
    node = _get(cfg, role)
    if micro_global is not None and micro_per_gpu is not None:
        errors.append(f"set only one of {role}.{name} (deprecated, global) and {role}.{name}_per_gpu")
        return
    if micro_global is not None:
        micro_per_gpu = max(1, micro_global // n_dev)
        setattr(node, f"{name}_per_gpu", micro_per_gpu)
        notes.append(f"{role}.{name} is deprecated (global); using {role}.{name}_per_gpu={micro_per_gpu}")
    trajectories = mini * n
    if trajectories % n_dev:
        errors.append(f"{role}.ppo_mini_batch_size={mini} prompts x rollout.n={n} = {trajectories} trajectories "
                      f"per mini-batch cannot be split over {n_dev} {devices}; make it a multiple of {n_dev}")
        return
    per_dev = trajectories // n_dev
    if dynamic:
        return
    if micro_per_gpu is None:
        errors.append(f"{role}.{name}_per_gpu is not set: each device's share of a mini-batch "
                      f"({mini} prompts x {n} = {trajectories} trajectories / {n_dev} {devices} = {per_dev}) is "
                      f"processed in micro-batches of this many trajectories. Set it (e.g. "
                      f"{role}.{name}_per_gpu={_largest_divisor(per_dev, 8)}) or use {role}.use_dynamic_bsz=true")
        return
    if micro_per_gpu < 1:
        errors.append(f"{role}.{name}_per_gpu={micro_per_gpu} must be >= 1 (trajectories per micro-batch); each "
                      f"device's share of a mini-batch is {mini} prompts x rollout.n={n} / {n_dev} {devices} = {per_dev}")
    # A size that does not divide the share leaves a shorter last micro-batch (as in verl 0.9): every loss is
    # normalised by the whole mini-batch's counts, so the update does not depend on the split.


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)
