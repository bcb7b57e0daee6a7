"""Rules that depend on the machine the run starts on, and what the engines' own checks share: the device the run
computes on (``trainer.device=auto`` resolved as the run resolves it) and the precision names. To check a GPU job on
a CPU machine, dry-run it with ``trainer.device=cuda``.

What each rollout engine can do on the device is that engine's rule (``rollout/<engine>/checks.py``, run by the
launch's pipeline); here: where the step plan reuses the rollout's log-probs as pi_old, the rollout must compute in
the training precision (on GPU; on CPU both compute in fp32).
"""

from __future__ import annotations

import os

from hybridflow.config.schema import PPOConfig

__all__ = ["check_rollout_precision", "device_hint", "gpu_visible", "precision_name", "resolve_device"]

_PRECISIONS = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
               "fp16": "fp16", "float16": "fp16", "half": "fp16"}


def gpu_visible() -> bool:
    """A cheap guess (no torch import) whether this machine has an NVIDIA/AMD GPU this process may use."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/kfd"))


def resolve_device(cfg: PPOConfig) -> str:
    """``trainer.device`` as the run resolves it: ``auto`` is cuda when torch sees a GPU, else cpu."""
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    if not gpu_visible():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_hint(cfg: PPOConfig) -> str:
    """What to add to a CPU refusal when the user did not ask for the CPU."""
    if cfg.trainer.device == "cpu":
        return ""
    return " (trainer.device=auto found no GPU here; to check a GPU job on this machine, dry-run it with " \
           "trainer.device=cuda)"


def precision_name(dtype) -> str | None:
    """fp32 / bf16 / fp16 for any of their spellings; ``None`` for an unknown one."""
    return _PRECISIONS.get(str(dtype).lower())


def check_rollout_precision(cfg: PPOConfig, errors: list[str], notes: list[str], ctx) -> None:
    """Where the step plan reuses the rollout's log-probs as pi_old, on GPU the rollout must compute in the actor's
    precision (``rollout.dtype`` vs ``actor.fsdp_config.dtype``); on CPU both compute in fp32."""
    from hybridflow.config.plan import plan_step

    arr = cfg.actor_rollout_ref
    rollout, actor = arr.rollout, arr.actor
    if ctx.device == "cpu" or not plan_step(cfg).reuse_rollout_log_probs:
        return
    if precision_name(rollout.dtype) == precision_name(actor.fsdp_config.dtype):
        return
    errors.append(
        f"actor_rollout_ref.rollout.dtype={rollout.dtype} but actor_rollout_ref.actor.fsdp_config.dtype="
        f"{actor.fsdp_config.dtype}: this configuration uses the rollout's log-probs as pi_old (step plan: "
        "rollout.calculate_log_probs=true with an exactly on-policy update, or bypass mode), so they must come from "
        f"the training precision. Set actor_rollout_ref.rollout.dtype={actor.fsdp_config.dtype}, or let the actor "
        "recompute pi_old (rollout.calculate_log_probs=false)"
    )
