"""Config-time checks of Ulysses sequence parallelism (``*.ulysses_sequence_parallel_size``), in one place.

A role with sp > 1 runs on ``trainer.nnodes x trainer.n_gpus_per_node`` devices as dp x sp (``engine/
parallel_dims.py``): the batch is split over the dp = devices / sp groups, so the mini-batch arithmetic of the
actor and the critic divides by dp instead of the device count (:func:`data_parallel_size`, verl's rule:
``ppo_mini_batch_size x rollout.n / (world / sp)``).  As in verl, sequence parallelism splits the padding-free
packed sequence, so it needs ``use_remove_padding=true``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from hybridflow.utils.sequence_parallel_rules import ulysses_head_error

__all__ = ["check_sequence_parallel", "data_parallel_size", "n_devices", "sp_roles"]


def n_devices(cfg: Any) -> int:
    """Devices of the training pool; the local backend always runs one process."""
    if cfg.trainer.backend == "local":
        return 1
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def sp_roles(cfg: Any) -> list[tuple[str, int, bool, str]]:
    """(config prefix, sp, use_remove_padding, model path) of every role the run builds."""
    arr = cfg.actor_rollout_ref
    roles = [("actor_rollout_ref.actor", arr.actor.ulysses_sequence_parallel_size, arr.actor.use_remove_padding,
              arr.model.path),
             ("actor_rollout_ref.ref", arr.ref.ulysses_sequence_parallel_size, arr.model.use_remove_padding,
              arr.model.path)]
    if cfg.use_critic:
        roles.append(("critic", cfg.critic.ulysses_sequence_parallel_size, cfg.critic.model.use_remove_padding,
                      cfg.critic.model.path))
    if cfg.reward_model.enable:
        rm = cfg.reward_model
        roles.append(("reward_model", rm.ulysses_sequence_parallel_size, rm.model.use_remove_padding, rm.model.path))
    return roles


def role_model_parallel(cfg: Any, role: str) -> int:
    """The ranks of ``role`` that hold the same rows besides its sequence-parallel peers: tensor x pipeline parallel
    (1 unless its strategy is megatron: config/checks/megatron.py)."""
    node = {"actor_rollout_ref.actor": cfg.actor_rollout_ref.actor, "actor_rollout_ref.ref": cfg.actor_rollout_ref.ref,
            "critic": cfg.critic}.get(role)
    if node is None or node.strategy != "megatron":
        return 1
    m = node.megatron
    return max(1, int(m.tensor_model_parallel_size or 1)) * max(1, int(m.pipeline_model_parallel_size or 1))


def data_parallel_size(cfg: Any, role: str) -> int:
    """Data-parallel groups of ``role`` (``actor_rollout_ref.actor``, ``critic``, ...): devices / (pp x sp x tp)."""
    sp = {prefix: size for prefix, size, _, _ in sp_roles(cfg)}.get(role, 1)
    sp = max(1, sp) * role_model_parallel(cfg, role)  # tensor- and pipeline-parallel peers share their rows too
    n_dev = n_devices(cfg)
    return n_dev // sp if n_dev % sp == 0 else n_dev


def _head_counts(path: str | None) -> tuple[int, int] | None:
    """(attention heads, key/value heads) from a local checkpoint's config.json (None when not readable here)."""
    file = os.path.join(str(path or ""), "config.json")
    if not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    text = raw.get("text_config") or raw
    heads = text.get("num_attention_heads", raw.get("num_attention_heads"))
    if heads is None:
        return None
    kv = text.get("num_key_value_heads", raw.get("num_key_value_heads")) or heads
    return int(heads), int(kv)


def check_sequence_parallel(cfg: Any, errors: list[str]) -> None:
    """Every ``*.ulysses_sequence_parallel_size`` either builds a layout or is an error naming the key and fix."""
    n_dev = n_devices(cfg)
    arr = cfg.actor_rollout_ref
    for prefix, sp, rmpad, path in sp_roles(cfg):
        key = f"{prefix}.ulysses_sequence_parallel_size"
        if sp < 1:
            errors.append(f"{key}={sp}: must be >= 1 (1 turns sequence parallelism off)")
            continue
        if sp == 1:
            continue
        if n_dev % sp:
            where = "the local backend runs one process" if cfg.trainer.backend == "local" else \
                f"trainer.nnodes x trainer.n_gpus_per_node = {n_dev} devices"
            errors.append(f"{key}={sp} must divide the devices of the role ({where}); each group of {sp} devices "
                          f"shares the same sequences, so choose a divisor of {n_dev}")
            continue
        if not rmpad:
            field = {"critic": "critic.model.use_remove_padding",
                     "reward_model": "reward_model.model.use_remove_padding",
                     "actor_rollout_ref.actor": "actor_rollout_ref.actor.use_remove_padding"}.get(
                         prefix, "actor_rollout_ref.model.use_remove_padding")
            errors.append(f"{key}={sp} splits the padding-free packed sequence over {sp} devices, so it needs "
                          f"{field}=true (as in verl)")
            continue
        heads = _head_counts(path)
        problem = ulysses_head_error(heads[0], heads[1], sp, key) if heads is not None else None
        if problem:
            errors.append(problem)
    if arr.actor.use_prefix_grouper and arr.actor.ulysses_sequence_parallel_size > 1:
        errors.append("actor_rollout_ref.actor.use_prefix_grouper=true with actor_rollout_ref.actor."
                      f"ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size}: the grouped forward "
                      "keeps a group's prompt and samples in one sequence, which Ulysses would split over devices; "
                      "set one of the two back (use_prefix_grouper=false or ulysses_sequence_parallel_size=1)")
    lora = int(arr.model.lora_rank) > 0 or arr.model.lora_adapter_path is not None
    if lora and arr.ref.ulysses_sequence_parallel_size != arr.actor.ulysses_sequence_parallel_size:
        errors.append(f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={arr.ref.ulysses_sequence_parallel_size} "
                      "differs from the actor's "
                      f"({arr.actor.ulysses_sequence_parallel_size}); with LoRA the reference policy is the actor "
                      "with its adapters disabled, so it runs on the actor's layout: leave ref's unset or equal")
