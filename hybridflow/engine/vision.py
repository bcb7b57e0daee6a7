"""The vision side of a vision-language policy: finding, freezing and LoRA-excluding the vision tower,
merging per-row pixel inputs into a micro-batch, and keeping the tower in every FSDP step.

Supported models are the Qwen2-VL family (``qwen2_vl``, ``qwen2_5_vl``): the positions of their image tokens
are the M-RoPE positions of ``data/mrope.py``, computed from the batch, so the actor, the reference and the
rollout all feed the model the positions it would compute itself. Other image-text-to-text models are
refused at load time, naming what is supported (their position schemes are not implemented here).

FSDP and text-only micro-batches: the vision blocks are FSDP units of their own, whose parameters are
all-gathered in forward and whose gradients are reduce-scattered in backward -- collectives that every rank
must join. A rank whose micro-batch has no image would skip the tower and leave the others waiting, so on a
sharded model a micro-batch without pixel inputs runs the tower on one blank 1-frame image and adds
``0 x`` its mean to the text embeddings (the outputs are unchanged; verl does the same inside its patched
Qwen2-VL forward). Here it is a forward pre-hook on the language model, installed for that pass only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch
from torch import nn

from hybridflow.data.mrope import MROPE_MODEL_TYPES
from hybridflow.data.multimodal import MODEL_INPUT_KEYS
from hybridflow.engine.transformers_adapter import unwrap_peft

__all__ = ["is_vision_language_config", "check_supported_vlm", "vision_tower", "freeze_vision_tower",
           "vision_linear_names", "merge_multi_modal_inputs", "vision_in_every_step"]

_TOWER_NAMES = ("visual", "vision_tower", "vision_model")


def is_vision_language_config(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def check_supported_vlm(config: Any, field: str) -> None:
    if is_vision_language_config(config) and config.model_type not in MROPE_MODEL_TYPES:
        raise ValueError(
            f"{field} is a '{config.model_type}' vision-language model; vision-language RL supports "
            f"{', '.join(MROPE_MODEL_TYPES)} (Qwen2-VL / Qwen2.5-VL checkpoints)"
        )


def vision_tower(model: nn.Module) -> tuple[str, nn.Module] | None:
    """(qualified name, module) of the vision encoder (incl. its merger/projector), or None for a text model."""
    for name, sub in unwrap_peft(model).named_modules():
        if name.rsplit(".", 1)[-1] in _TOWER_NAMES:
            return name, sub
    return None


def freeze_vision_tower(model: nn.Module, field: str = "actor_rollout_ref.actor.freeze_vision_tower") -> int:
    """Stop training the vision encoder (``requires_grad=False``); returns how many tensors were frozen."""
    found = vision_tower(model)
    if found is None:
        raise ValueError(f"{field}=true but the model ({type(unwrap_peft(model)).__name__}) has no vision tower; "
                         f"set {field}=false for a text-only model")
    params = list(found[1].parameters())
    for p in params:
        p.requires_grad_(False)
    return len(params)


def vision_linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the vision tower's linear layers (excluded from LoRA: adapters go on the LM only)."""
    found = vision_tower(model)
    if found is None:
        return []
    prefix, tower = found
    return [f"{prefix}.{name}" for name, sub in tower.named_modules() if isinstance(sub, nn.Linear)]


def merge_multi_modal_inputs(rows: Sequence[Any] | None, device: torch.device) -> dict[str, torch.Tensor]:
    """One micro-batch's model inputs from its rows' ``multi_modal_inputs`` dicts (rows without images add
    nothing): pixel patches and grids concatenated in row order, the order of the image tokens in the batch."""
    if rows is None:
        return {}
    merged: dict[str, list[torch.Tensor]] = {}
    for row in rows:
        for key in MODEL_INPUT_KEYS:
            value = (row or {}).get(key)
            if value is not None:
                merged.setdefault(key, []).append(torch.as_tensor(value))
    return {k: torch.cat(v, dim=0).to(device) for k, v in merged.items()}


def _language_model(model: nn.Module) -> nn.Module | None:
    base = unwrap_peft(model)
    inner = getattr(base, "model", None)
    return getattr(inner, "language_model", None)


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else []
    return [t for v in values for t in _tensors(v)]


@contextlib.contextmanager
def vision_in_every_step(model: nn.Module, has_pixels: bool, sharded: bool) -> Iterator[None]:
    """On a sharded VLM, make a text-only pass run the vision tower too (see the module docstring)."""
    found = vision_tower(model) if sharded and not has_pixels else None
    lm = _language_model(model) if found is not None else None
    if lm is None:
        yield
        return
    tower = found[1]
    vc = unwrap_peft(model).config.vision_config
    m = int(vc.spatial_merge_size)
    patch = int(vc.in_channels) * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2

    def add_blank_image(_module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            return None
        pixels = torch.zeros(m * m, patch, dtype=embeds.dtype, device=embeds.device)
        grid = torch.tensor([[1, m, m]], dtype=torch.long, device=embeds.device)
        # Every output (pre- and post-merger) joins the graph, so every tower parameter gets a (zero)
        # gradient: FSDP reduce-scatters a unit's gradients as one buffer whose size must agree across ranks.
        touch = sum(t.float().mean() for t in _tensors(tower(pixels, grid_thw=grid)))
        kwargs["inputs_embeds"] = embeds + (0.0 * touch).to(embeds.dtype)
        return args, kwargs

    handle = lm.register_forward_pre_hook(add_blank_image, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()
