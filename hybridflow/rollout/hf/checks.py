"""This engine's configuration rules, run by the launch's check pipeline (run stage): keys that act differently on
CPU than verl users expect (the hf engine computes in fp32 there and bounds its KV cache by sequence counts)."""

from __future__ import annotations

from hybridflow.config.checks.machine import precision_name
from hybridflow.rollout.moe_layout import moe_split_note

__all__ = ["device_errors", "device_notes", "model_errors"]


def device_errors(cfg, device: str) -> list[str]:
    return []


def device_notes(cfg, device: str) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    notes = [note for note in (moe_split_note(rollout, "hf"),) if note]
    if device == "cpu":
        if precision_name(rollout.dtype) not in ("bf16", None):
            notes.append(f"actor_rollout_ref.rollout.dtype={rollout.dtype} has no effect on CPU: the hf rollout "
                         "computes in fp32 there, like the actor")
        if rollout.gpu_memory_utilization != 0.5:
            notes.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} has no "
                         "effect on CPU: the hf KV cache is bounded by rollout.max_num_seqs and max_model_len there")
    return notes


def model_errors(cfg) -> list[str]:
    return []
