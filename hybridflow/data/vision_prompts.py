"""Prompts of a vision-language model: the processor renders, tokenizes and expands them; positions follow.

:class:`VisionPrompts` is what :class:`~hybridflow.data.rl_dataset.RLHFDataset` uses for every row once the
checkpoint has a multimodal processor (text-only rows of such a dataset too, so that all items share one
layout): it checks the processor can render chat prompts, runs it (``data/multimodal.py``), refuses a
truncation that would cut vision tokens (the pixel inputs would no longer match the prompt), and computes the
prompt's ``position_ids`` -- (4, P) for the Qwen2-VL family (``data/mrope.py``), (P,) otherwise.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from hybridflow.data.mrope import spec_from_processor, text_position_ids, vlm_position_ids
from hybridflow.data.multimodal import MultimodalDataError, ProcessedPrompt, build_messages, process_prompt
from hybridflow.data.prompts import truncate

__all__ = ["VisionPrompts"]


def _tokens_per_second(tokenizer: Any) -> float | None:
    """Qwen2.5-VL's ``vision_config.tokens_per_second`` from the checkpoint folder the tokenizer came from."""
    config = os.path.join(str(getattr(tokenizer, "name_or_path", "") or ""), "config.json")
    if not os.path.isfile(config):
        return None
    with open(config, encoding="utf-8") as f:
        return (json.load(f).get("vision_config") or {}).get("tokens_per_second")


class VisionPrompts:
    """Processor-side prompt handling for one multimodal checkpoint."""

    def __init__(self, processor: Any, tokenizer: Any):
        if not getattr(processor, "chat_template", None):
            raise MultimodalDataError(
                f"the multimodal processor ({type(processor).__name__}) has no chat template, so prompts with images "
                "cannot be rendered. Set actor_rollout_ref.model.custom_chat_template to the model's Jinja chat "
                "template (it must render {'type': 'image'} content items), or use an instruct checkpoint that "
                "ships chat_template.jinja / chat_template.json"
            )
        self.processor = processor
        self.tokenizer = tokenizer
        self.spec = spec_from_processor(processor, _tokens_per_second(tokenizer))
        self.vision_token_ids = {int(t) for t in (getattr(processor, "image_token_id", None),
                                                  getattr(processor, "video_token_id", None)) if t is not None}

    def process(self, messages: list[dict[str, Any]], images: list[Any], videos: list[Any],
                template_kwargs: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], ProcessedPrompt]:
        structured = build_messages(messages, images, videos)
        return structured, process_prompt(self.processor, structured, images, videos, template_kwargs, where)

    def truncate(self, ids: list[int], max_len: int, mode: str, where: str) -> list[int]:
        """``data.truncation`` as for text, refused when it would remove vision tokens."""
        kept = truncate(ids, max_len, mode, where)
        if len(kept) < len(ids):
            before = sum(t in self.vision_token_ids for t in ids)
            if sum(t in self.vision_token_ids for t in kept) != before:
                raise MultimodalDataError(
                    f"{where}: the prompt is {len(ids)} tokens ({before} of them image/video tokens) and "
                    f"data.truncation={mode} to data.max_prompt_length={max_len} would cut image tokens, which "
                    "breaks the pairing with the pixel inputs. Raise data.max_prompt_length, shrink the images "
                    "(the image processor's max_pixels), or set data.filter_overlong_prompts=true"
                )
        return kept

    def position_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     prompt: ProcessedPrompt) -> torch.Tensor:
        """(4, P) for Qwen2-VL-family models, else the text layout (P,)."""
        if self.spec is None:
            return text_position_ids(attention_mask)
        mm = prompt.multi_modal_inputs
        return vlm_position_ids(input_ids, attention_mask, self.spec, mm.get("image_grid_thw"),
                                mm.get("video_grid_thw"), mm.get("second_per_grid_ts"))
