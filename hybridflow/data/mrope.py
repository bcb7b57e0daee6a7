"""Multimodal rotary positions (M-RoPE) of the Qwen2-VL family, computed from token ids and vision grids.

Qwen2-VL (Wang et al. 2024, arXiv:2409.12191, section 2.1) rotates each token by three position ids
(temporal, height, width). Text tokens use the same value on all three axes, counting up by one. The
``t x h x w`` tokens of an image or video (after the vision tower merges ``merge x merge`` patches) get
``start + (t, row, column)``, and the text after it resumes at ``start + max(h, w)`` (h, w counted in merged
tokens). For Qwen2.5-VL videos the temporal index is scaled by ``tokens_per_second x seconds per grid``;
still images keep a step of 1. This is what transformers' ``get_rope_index`` computes (checked in
``tests/data/test_mrope.py``), done here without a model so the dataset, the rollout and the actor can all
produce the positions the model would.

Batch layout (verl's): ``position_ids`` of a VLM batch is ``(B, 4, L)``: row 0 the text positions
(``cumsum(attention_mask) - 1`` clipped at 0, which restart per sequence and let a packed forward find
sequence boundaries), rows 1-3 the (t, h, w) M-RoPE positions, 0 on padding. A text model's batch keeps
``(B, L)``. :func:`model_position_ids` turns a (B, 4, L) slice into what the HF model takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["MROPE_MODEL_TYPES", "MropeSpec", "spec_from_processor", "mrope_positions", "vlm_position_ids", "text_position_ids",
           "model_position_ids", "uses_mrope"]

# model_type -> whether video temporal ids are scaled by tokens_per_second x second_per_grid_ts
MROPE_MODEL_TYPES = {"qwen2_vl": False, "qwen2_5_vl": True}


def uses_mrope(model_type: str | None) -> bool:
    return model_type in MROPE_MODEL_TYPES


@dataclass(frozen=True)
class MropeSpec:
    """What the position computation needs from a checkpoint's config."""

    model_type: str
    image_token_id: int
    video_token_id: int
    spatial_merge_size: int
    tokens_per_second: float | None = None

    @classmethod
    def from_hf_config(cls, config: Any) -> "MropeSpec":
        if config.model_type not in MROPE_MODEL_TYPES:
            raise ValueError(
                f"multimodal rotary positions are implemented for {', '.join(MROPE_MODEL_TYPES)}, not "
                f"'{config.model_type}'; use a Qwen2-VL or Qwen2.5-VL checkpoint"
            )
        vision = config.vision_config
        return cls(config.model_type, int(config.image_token_id), int(config.video_token_id),
                   int(vision.spatial_merge_size), getattr(vision, "tokens_per_second", None))


_PROCESSOR_MODEL_TYPES = {"Qwen2VLProcessor": "qwen2_vl", "Qwen2_5_VLProcessor": "qwen2_5_vl"}


def spec_from_processor(processor: Any, tokens_per_second: float | None = None) -> MropeSpec | None:
    """The spec of a Qwen2-VL-family processor (``None`` for processors of models without M-RoPE).

    ``tokens_per_second`` (Qwen2.5-VL's vision config) only matters for videos; without it a Qwen2.5-VL video
    is refused by :func:`mrope_positions`.
    """
    # by class (or base class: the image-only subclass of write_image_only_processor is a Qwen2VLProcessor too)
    model_type = next((_PROCESSOR_MODEL_TYPES[c.__name__] for c in type(processor).__mro__
                       if c.__name__ in _PROCESSOR_MODEL_TYPES), None)
    if model_type is None:
        return None
    return MropeSpec(model_type, int(processor.image_token_id), int(processor.video_token_id),
                     int(processor.image_processor.merge_size), tokens_per_second)


def _runs(kinds: list[int]) -> list[tuple[int, int, int]]:
    """(kind, start, end) of each maximal run of equal values."""
    runs, start = [], 0
    for i in range(1, len(kinds) + 1):
        if i == len(kinds) or kinds[i] != kinds[start]:
            runs.append((kinds[start], start, i))
            start = i
    return runs


def mrope_positions(
    ids: Sequence[int] | torch.Tensor,
    spec: MropeSpec,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: Sequence[float] | torch.Tensor | None = None,
) -> torch.Tensor:
    """(3, n) positions of one sequence's ``n`` valid (unpadded) tokens.

    ``image_grid_thw`` / ``video_grid_thw``: (k, 3) grids of this sequence's images / videos in order of
    appearance, in patches (the processor's output). Every run of image (video) tokens takes the next grid.
    """
    ids_t = torch.as_tensor(ids, dtype=torch.long).flatten()
    kinds = torch.zeros_like(ids_t)
    kinds[ids_t == spec.image_token_id] = 1
    kinds[ids_t == spec.video_token_id] = 2
    grids = {1: list(image_grid_thw.tolist()) if image_grid_thw is not None else [],
             2: list(video_grid_thw.tolist()) if video_grid_thw is not None else []}
    seconds = list(torch.as_tensor(second_per_grid_ts).tolist()) if second_per_grid_ts is not None else []
    used = {1: 0, 2: 0}
    pieces, pos = [], 0
    for kind, start, end in _runs(kinds.tolist()):
        if kind == 0:
            pieces.append(torch.arange(pos, pos + end - start).expand(3, -1))
            pos += end - start
            continue
        if used[kind] >= len(grids[kind]):
            raise ValueError(f"the sequence has more {_MEDIA[kind]} token runs than {_MEDIA[kind]}_grid_thw rows "
                             f"({len(grids[kind])})")
        second = seconds[used[kind]] if kind == 2 and used[kind] < len(seconds) else 1.0
        piece, width = _media_positions(spec, kind, grids[kind][used[kind]], second, end - start)
        used[kind] += 1
        pieces.append(piece + pos)
        pos += width
    for kind, name in _MEDIA.items():
        if used[kind] != len(grids[kind]):
            raise ValueError(f"the sequence has {used[kind]} {name} token runs but {len(grids[kind])} "
                             f"{name}_grid_thw rows")
    return torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)


_MEDIA = {1: "image", 2: "video"}


def _media_positions(spec: MropeSpec, kind: int, grid: Sequence[int], second: float,
                     length: int) -> tuple[torch.Tensor, int]:
    """(3, ``length``) positions of one image's (``kind`` 1) or video's (2) run of tokens counted from 0 -- time,
    height, width of each merged patch -- and the width the run takes in the text's positions."""
    name = _MEDIA[kind]
    t, h, w = (int(v) for v in grid)
    step = 1.0
    if kind == 2 and MROPE_MODEL_TYPES[spec.model_type]:  # Qwen2.5-VL: video time in absolute seconds
        if spec.tokens_per_second is None:
            raise ValueError(f"{spec.model_type} video positions need vision_config.tokens_per_second")
        step = float(spec.tokens_per_second) * float(second)
    m = spec.spatial_merge_size
    lh, lw = h // m, w // m
    if t * lh * lw != length:
        raise ValueError(f"a run of {length} {name} tokens does not match its grid (t={t}, h={h}, w={w}, "
                         f"merge={m}: {t * lh * lw} tokens); the prompt and the pixel inputs were made apart")
    tt = (torch.arange(t) * step).long().view(t, 1, 1).expand(t, lh, lw)
    hh = torch.arange(lh).view(1, lh, 1).expand(t, lh, lw)
    ww = torch.arange(lw).view(1, 1, lw).expand(t, lh, lw)
    return torch.stack([tt, hh, ww]).reshape(3, -1), max(h, w) // m


def text_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` clipped at 0 (the text-model layout), any leading shape."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def vlm_position_ids(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    spec: MropeSpec,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: Sequence[float] | None = None,
) -> torch.Tensor:
    """(4, L) positions of one padded row: text positions, then (t, h, w) M-RoPE, 0 on padding."""
    mask = attention_mask.bool()
    out = torch.zeros(4, input_ids.shape[-1], dtype=torch.long)
    out[0] = text_position_ids(attention_mask)
    out[1:, mask] = mrope_positions(input_ids[mask], spec, image_grid_thw, video_grid_thw, second_per_grid_ts)
    return out


def model_position_ids(position_ids: torch.Tensor, packed: bool = False) -> torch.Tensor:
    """What the HF model's ``position_ids`` argument takes for a (B, L) or (B, 4, L) batch slice.

    A (B, L) slice passes through. For (B, 4, L): a padded batch gets the (3, B, L) M-RoPE rows (the attention
    mask marks padding); a packed row (B = 1, no attention mask) gets all four rows as (4, 1, N), the first
    (text positions restarting at 0 per sequence) telling transformers where the sequences start.
    """
    if position_ids.dim() == 2:
        return position_ids
    rows = position_ids.transpose(0, 1)
    return rows if packed else rows[1:]
