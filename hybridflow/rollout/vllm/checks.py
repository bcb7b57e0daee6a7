"""This engine's configuration rules, run by the launch's check pipeline (run stage): what vLLM can do on the device
the run computes on, and whether it can serve the checkpoint. Read from the config and the model folder only."""

from __future__ import annotations

from hybridflow.config.checks.machine import device_hint
from hybridflow.rollout.moe_layout import moe_split_note
from hybridflow.rollout.vllm.config import vllm_cpu_model_error, vllm_vision_settings

__all__ = ["device_errors", "device_notes", "model_errors"]

_PARALLEL_KEYS = ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size")
_KEY = "actor_rollout_ref.rollout"


def device_errors(cfg, device: str) -> list[str]:
    """On CPU one engine runs per worker process: its parallelism keys above 1 (verl's default TP is 2) cannot act,
    CUDA graphs do not exist, and some checkpoints vLLM's CPU build cannot serve."""
    if device != "cpu":
        return []
    rollout, where = cfg.actor_rollout_ref.rollout, device_hint(cfg)
    errors = []
    for name in _PARALLEL_KEYS:
        value = int(getattr(rollout, name))
        if value > 1:
            errors.append(f"{_KEY}.{name}={value}: vLLM on CPU runs one engine per worker process and cannot split a "
                          f"model over devices; set {_KEY}.{name}=1 (verl's default TP is 2){where}")
    if rollout.cudagraph_capture_sizes:
        errors.append(f"{_KEY}.cudagraph_capture_sizes={rollout.cudagraph_capture_sizes}: CUDA graphs need a GPU; "
                      f"remove the key (or set it to null) on CPU{where}")
    model_error = vllm_cpu_model_error(str(cfg.actor_rollout_ref.model.path))
    if model_error:
        errors.append(model_error)
    return errors


def device_notes(cfg, device: str) -> list[str]:
    notes = [note for note in (moe_split_note(cfg.actor_rollout_ref.rollout, "vllm"),) if note]
    if device == "cpu" and cfg.actor_rollout_ref.rollout.enable_chunked_prefill:
        notes.append(f"{_KEY}.enable_chunked_prefill=true: vLLM on CPU runs without chunked prefill (vLLM 0.32's CPU "
                     "worker fails on seeded requests whose prefill is split; every rollout request carries a seed), "
                     "so each prompt is prefilled in one step")
    return notes


def model_errors(cfg) -> list[str]:
    """The vllm adapter serves Qwen2-VL when vLLM can load it (``vllm_vision_settings``: torchvision or an image-only
    processor in the folder, colocated engines only)."""
    rollout, model = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model
    extra = dict(rollout.engine_kwargs.get("vllm") or {})
    try:
        vllm_vision_settings(str(model.path), extra.get("model_impl"),
                             bool(model.trust_remote_code) or bool(extra.get("trust_remote_code")),
                             hybrid=bool(cfg.actor_rollout_ref.hybrid_engine))
    except ValueError as e:
        return [str(e)]
    return []
