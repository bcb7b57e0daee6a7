"""Rollout-engine keys that cannot act on the hardware at hand are refused, with the reason and the fix.

vLLM's parallelism keys need devices to split over: on CPU one engine runs per worker process, so
``tensor_model_parallel_size``, ``data_parallel_size`` and ``pipeline_model_parallel_size`` above 1 (verl's
default TP is 2) cannot act, and CUDA graphs (``cudagraph_capture_sizes``) do not exist.  SGLang has no CPU build.
vLLM's CPU build lists some model types it does not serve correctly (DeepSeek-V3, ``vllm_config.VLLM_CPU_REFUSED``).

When the device is known at config time (``trainer.device=cpu``) the check runs in ``validate_config``; with
``trainer.device=auto`` it runs again when ``hybridflow train`` starts, before any worker or model (the preflight),
with the resolved device -- so ``--dry-run`` of a GPU job on a laptop still passes, with a note.
"""

from __future__ import annotations

import os

__all__ = ["rollout_hardware_errors", "rollout_hardware_notes", "rollout_model_errors", "gpu_visible"]

_PARALLEL_KEYS = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")


def gpu_visible() -> bool:
    """A cheap guess (no torch import) whether this machine has an NVIDIA/AMD GPU this process may use."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidia0", "/dev/kfd"))


def rollout_hardware_errors(cfg, device: str) -> list[str]:
    """Errors for rollout keys that cannot act on ``device`` (``"cpu"`` or ``"cuda"``); empty when all can."""
    rollout = cfg.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout"
    errors: list[str] = []
    if device != "cpu":
        return errors
    if rollout.name == "sglang":
        errors.append(f"{key}.name=sglang: SGLang has no CPU build, so it runs only on a GPU machine; on CPU use "
                      f"{key}.name=vllm (the vllm-cpu build, see docs/rollout_engines.md) or {key}.name=hf")
    if rollout.name == "vllm":
        for name in _PARALLEL_KEYS:
            value = int(getattr(rollout, name))
            if value > 1:
                errors.append(f"{key}.{name}={value}: vLLM on CPU runs one engine per worker process and cannot "
                              f"split a model over devices; set {key}.{name}=1 (verl's default TP is 2)")
        if rollout.cudagraph_capture_sizes:
            errors.append(f"{key}.cudagraph_capture_sizes={rollout.cudagraph_capture_sizes}: CUDA graphs need a GPU; "
                          f"remove the key (or set it to null) on CPU")
        from hybridflow.rollout.vllm_config import vllm_cpu_model_error

        model_error = vllm_cpu_model_error(str(cfg.actor_rollout_ref.model.path))
        if model_error:
            errors.append(model_error)
    return errors


def rollout_model_errors(cfg) -> list[str]:
    """Errors for a rollout engine that cannot serve ``actor_rollout_ref.model.path`` here: the sglang adapter is
    text-only; the vllm adapter serves Qwen2-VL when vLLM can load it (``vllm_vision_settings``: torchvision or an
    image-only processor in the folder, colocated engines only).  Read from the model folder; no model loads."""
    from hybridflow.rollout.vllm_config import text_only_engine_error, vllm_vision_settings

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


def rollout_hardware_notes(cfg, device: str) -> list[str]:
    """Keys that act differently on ``device`` than verl users expect (said once, at config time)."""
    rollout = cfg.actor_rollout_ref.rollout
    if device == "cpu" and rollout.name == "vllm" and rollout.enable_chunked_prefill:
        return ["actor_rollout_ref.rollout.enable_chunked_prefill=true: vLLM on CPU runs without chunked prefill "
                "(vLLM 0.32's CPU worker fails on seeded requests whose prefill is split; every rollout request "
                "carries a seed), so each prompt is prefilled in one step"]
    return []
