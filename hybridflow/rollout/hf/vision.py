"""Image requests of the ``hf`` engine: pixel inputs and multimodal rotary positions of one prompt.

A vision-language request arrives as prompt ids already expanded by the processor (each image a run of
``t x h x w / merge^2`` ``<|image_pad|>`` tokens, as the agent loop rendered it) plus the images themselves
(``multi_modal_data={"image": [PIL images]}``, verl's name; ``"images"`` is accepted too). Here the images go
through the checkpoint's image processor -- the same deterministic transform the agent loop and the actor
use, so the pixels agree bit for bit -- and the prompt's M-RoPE positions are computed
(:mod:`hybridflow.data.mrope`, checked against transformers' ``get_rope_index``).

Decoding after the prompt: every generated token is text, so its three M-RoPE axes are equal and advance
by one per token from ``max(prompt positions) + 1``. With the engine's layout (cache column = index in the
sequence) that is ``column + rope_delta`` where ``rope_delta = max(prompt positions) + 1 - len(prompt)``,
transformers' ``rope_deltas`` (``Qwen2VLForConditionalGeneration`` adds it to the cache length during
``generate``). A text request has ``rope_delta = 0``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.data.mrope import MROPE_MODEL_TYPES, MropeSpec, mrope_positions
from hybridflow.rollout.multi_modal import images_of

__all__ = ["VisionRequest", "VisionPreparer"]

@dataclass(eq=False)
class VisionRequest:
    """What the prefill forward of one image prompt needs on top of its token ids."""

    pixel_values: torch.Tensor  # (patches, C * temporal_patch * patch^2)
    image_grid_thw: torch.Tensor  # (images, 3)
    positions: torch.Tensor  # (3, len(prompt)) M-RoPE positions
    rope_delta: int  # decode position of column c is c + rope_delta
    key: bytes  # identifies the pixels: identical prompts share one prefill only with identical images


class VisionPreparer:
    """Turns ``multi_modal_data`` into a :class:`VisionRequest` for one vision-language model.

    ``processor``: the checkpoint's multimodal processor (its ``image_processor`` is used); ``model_config``:
    the model's HF config (``None`` or a text-only config: every image request is refused).
    """

    def __init__(self, processor: Any, model_config: Any):
        self.processor = processor
        vision = getattr(model_config, "vision_config", None) is not None
        self.spec = MropeSpec.from_hf_config(model_config) if vision and model_config.model_type in MROPE_MODEL_TYPES \
            else None
        self.model_type = getattr(model_config, "model_type", None)

    def prepare(self, request_id: str, prompt_ids: list[int], multi_modal_data: Any) -> VisionRequest | None:
        images, videos = images_of(multi_modal_data)
        if not images and not videos:
            return None
        if self.spec is None:
            raise ValueError(
                f"request {request_id}: {len(images)} image(s) were sent to the hf rollout engine, but the model "
                f"(model_type {self.model_type!r}) is text-only. Point actor_rollout_ref.model.path at a "
                "Qwen2-VL / Qwen2.5-VL checkpoint, or drop the images (data.image_key names the image column)"
            )
        if videos:
            raise NotImplementedError(
                f"request {request_id}: the hf rollout engine generates with images, not videos (got {len(videos)}); "
                "drop the data.video_key column or sample frames as images"
            )
        if self.processor is None or getattr(self.processor, "image_processor", None) is None:
            raise ValueError(f"request {request_id}: images need the model's multimodal processor; the hf engine "
                             "was built without one (pass processor=...)")
        out = self.processor.image_processor(images=list(images), return_tensors="pt")
        pixels, grid = out["pixel_values"], out["image_grid_thw"]
        ids = torch.as_tensor(prompt_ids, dtype=torch.long)
        have = int((ids == self.spec.image_token_id).sum())
        m = self.spec.spatial_merge_size
        need = int((grid.prod(dim=-1) // (m * m)).sum())
        if have != need:
            raise ValueError(
                f"request {request_id}: the prompt holds {have} image tokens (id {self.spec.image_token_id}) but its "
                f"{len(images)} image(s) need {need}; render the prompt with the processor together with the same "
                "images (processor(text=..., images=...) or apply_chat_template with image content items), in the "
                "order they appear"
            )
        positions = mrope_positions(ids, self.spec, grid)
        delta = int(positions.max()) + 1 - len(prompt_ids)
        digest = hashlib.sha1(pixels.numpy().tobytes())
        digest.update(grid.numpy().tobytes())
        return VisionRequest(pixels, grid, positions, delta, digest.digest())
