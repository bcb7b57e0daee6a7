"""Megatron's LoRA node (verl's ``<model>.lora.*``) on the peft adapters this engine trains.

verl configures Megatron-Bridge's LoRA with a ``lora`` node; this engine wraps transformers' modules with peft.  The
node is read into the keys the engine already has (``lora_rank``, ``lora_alpha``, ``target_modules``,
``exclude_modules``, ``lora_adapter_path``) and into :class:`LoraOptions`, what peft needs beyond them:

* **module names**: Megatron's fused ``linear_qkv`` is ``q_proj, k_proj, v_proj`` here, ``linear_proj`` is ``o_proj``,
  ``linear_fc1`` is ``gate_proj, up_proj``, ``linear_fc2`` is ``down_proj``; the canonical-LoRA names
  (``linear_q``, ``linear_fc1_up``...) and DeepSeek's latent-attention ones (``linear_q_down_proj`` ->
  ``q_a_proj``...) likewise; ``router`` is the MoE gate.  A name with wildcards (``*.layers.0.*.linear_qkv``) becomes
  a regular expression over the module paths.  Megatron's fused qkv shares one A matrix between q, k and v; here each
  projection has its own adapter (Megatron's ``canonical_lora`` layout), so the adapter has 3 A matrices there.
* **initialisation**: ``lora_A_init_method`` / ``lora_B_init_method`` -- ``xavier`` (uniform), ``kaiming`` (uniform,
  a = sqrt(5), peft's and Megatron-Bridge's other choice), ``normal`` (std 1 / rank) or ``zero``; verl's default xavier
  A and zero B (so the adapted model starts equal to the base model).
* ``dropout`` (on the adapter's input: ``dropout_position=pre``, peft's), ``type=dora`` (peft's DoRA); the adapters
  are kept in the model's dtype (FSDP2 shards a layer's parameters in one dtype), so ``dtype`` must stay null.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["INIT_METHODS", "LORA_TYPES", "LoraOptions", "hf_module_names", "init_adapters", "lora_node_problems"]

INIT_METHODS = ("xavier", "kaiming", "normal", "zero")
LORA_TYPES = ("lora", "canonical_lora", "dora")
# Megatron module name -> the transformers modules it is here
_MEGATRON_NAMES = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_q": ("q_proj",), "linear_k": ("k_proj",), "linear_v": ("v_proj",),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"), "linear_fc1_gate": ("gate_proj",), "linear_fc1_up": ("up_proj",),
    "linear_fc2": ("down_proj",),
    "linear_q_proj": ("q_proj",), "linear_q_down_proj": ("q_a_proj",), "linear_q_up_proj": ("q_b_proj",),
    "linear_kv_down_proj": ("kv_a_proj_with_mqa",), "linear_kv_up_proj": ("kv_b_proj",),
    "router": ("gate",),
}


@dataclass(frozen=True)
class LoraOptions:
    """What peft needs beyond rank / alpha / targets (defaults: peft's own behaviour)."""

    dropout: float = 0.0
    use_dora: bool = False
    init_a: str | None = None  # None: peft's kaiming-uniform A
    init_b: str | None = None  # None: peft's zero B

    @classmethod
    def from_node(cls, node: dict | None) -> "LoraOptions":
        """The options of a model's ``lora`` node (``{}`` or rank 0: peft's defaults)."""
        node = dict(node or {})
        if int(node.get("rank") or 0) <= 0:
            return cls()
        return cls(float(node.get("dropout") or 0.0), node.get("type") == "dora", node.get("lora_A_init_method"),
                   node.get("lora_B_init_method"))


def _regex(pattern: str, names: tuple[str, ...]) -> str:
    prefix = re.escape(pattern.rsplit(".", 1)[0]).replace(r"\*", ".*") if "." in pattern else ".*"
    return rf"{prefix}\.(?:{'|'.join(names)})"


def hf_module_names(names: list[str] | str | None, key: str) -> tuple[Any, list[str]]:
    """``(peft target_modules, problems)`` for Megatron module names; a wildcard pattern makes the result a regex."""
    if not names:
        return None, []
    names = [names] if isinstance(names, str) else list(names)
    problems = [f"{key}: '{n}' is not a module name this engine knows (Megatron names: "
                f"{', '.join(_MEGATRON_NAMES)}; wildcards like '*.layers.0.*.linear_qkv' are accepted)"
                for n in names if n.rsplit(".", 1)[-1] not in _MEGATRON_NAMES]
    if problems:
        return None, problems
    if not any("*" in n or "." in n for n in names):
        return sorted({hf for n in names for hf in _MEGATRON_NAMES[n]}), []
    return "|".join(f"(?:{_regex(n, _MEGATRON_NAMES[n.rsplit('.', 1)[-1]])})" for n in names), []


def lora_node_problems(node: dict, key: str) -> list[str]:
    """The node's values that have no counterpart here (each message names the key and what to use)."""
    out = []
    if node.get("type") not in LORA_TYPES:
        out.append(f"{key}.type={node.get('type')!r}: choose lora, canonical_lora (the same adapters here: one per "
                   "projection) or dora (vlm_lora: use lora with actor_rollout_ref.actor.freeze_vision_tower)")
    for name in ("lora_A_init_method", "lora_B_init_method"):
        if node.get(name) not in INIT_METHODS:
            out.append(f"{key}.{name}={node.get(name)!r}: choose one of {', '.join(INIT_METHODS)}")
    if node.get("dropout_position") != "pre":
        out.append(f"{key}.dropout_position={node.get('dropout_position')!r}: peft applies the dropout to the "
                   "adapter's input (pre); use pre")
    if node.get("dtype") is not None:
        out.append(f"{key}.dtype={node.get('dtype')!r}: the adapters are kept in the model's dtype "
                   "(<role>.fsdp_config.model_dtype; FSDP2 shards a layer in one dtype) and compute in the mixed-precision "
                   "dtype; drop the key")
    for name in ("freeze_vision_model", "freeze_vision_projection", "freeze_language_model"):
        if node.get(name) is False:
            out.append(f"{key}.{name}=false: with LoRA every base weight stays frozen here; train the vision tower "
                       "without LoRA (actor_rollout_ref.actor.freeze_vision_tower=false) or drop the key")
    return out


def _init(weight: torch.Tensor, method: str, rank: int) -> None:
    if method == "xavier":
        nn.init.xavier_uniform_(weight)
    elif method == "kaiming":
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    elif method == "normal":
        nn.init.normal_(weight, std=1.0 / rank)
    else:
        nn.init.zeros_(weight)


@torch.no_grad()
def init_adapters(model: nn.Module, options: LoraOptions) -> None:
    """Re-initialise every adapter's A and B as ``options`` asks (a no-op for peft's defaults)."""
    for module in model.modules():
        for attr, method in (("lora_A", options.init_a), ("lora_B", options.init_b)):
            adapters = getattr(module, attr, None)
            if method is None or not isinstance(adapters, nn.ModuleDict):
                continue
            for linear in adapters.values():
                _init(linear.weight, method, min(linear.weight.shape))
