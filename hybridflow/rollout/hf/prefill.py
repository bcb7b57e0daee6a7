"""Prefill forwards of the ``hf`` engine: fresh prompts, reused prefixes and chunked long prompts.

Every new request becomes part of a :class:`PrefillJob` -- one distinct prompt, the cache rows that asked
for it, and how many of its leading tokens those rows already hold (``start``: a parked prefix copied in,
see :mod:`~hybridflow.rollout.hf.prefix_pool`).  :func:`run_prefill` runs the tokens ``[start, len)`` of every
job through the model in forwards of at most ``max_num_batched_tokens`` (padded) tokens, a long prompt in
several chunks, and returns each job's last-token logits. A forward groups chunks of similar length (each at
least ``_MIN_FILL`` of the longest), so that padding stays a small share of the work.

Layout of one forward: each job's chunk is *left*-padded to the forward's width, so the last position holds
every job's last token (``logits_to_keep=1`` computes one row of logits per job); token ``i`` of a chunk that
starts at position ``a`` has position (and cache column) ``a + i``.  Jobs whose chunk starts at 0 attend only
over the forward's own keys (a causal mask with padding); the others (``extend``) attend over their row's
cached columns ``[0, a)`` plus, causally, the chunk -- per query, every column up to its own position.
Padded query slots see every column so that no softmax row is empty; their outputs are never used.
A model's sliding-window layers additionally see only the keys less than a window behind each query
(:mod:`~hybridflow.rollout.hf.attention_masks`).

Image prompts (``job.vision``, :mod:`~hybridflow.rollout.hf.vision`) are never chunked and never start from a
reused prefix: the vision tower must see each image whole, in the forward that holds its tokens. A forward
with image prompts passes their pixel inputs (concatenated in row order, the order in which the model
scatters image features into image tokens) and (3, U, W) M-RoPE ``position_ids``; the text prompts of the
same forward get their plain positions on all three axes. An image prompt longer than
``max_num_batched_tokens`` runs in a forward of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hybridflow.engine.transformers_adapter import forward_with_cache
from hybridflow.rollout.hf.attention_masks import EngineMasks
from hybridflow.rollout.hf.kv_cache import SlotKVCache

__all__ = ["PrefillJob", "group_prefill_jobs", "run_prefill"]

# A chunk joins a forward only if it fills at least this share of the forward's width: shorter ones wait for a
# forward of their own length. Padding is computed like real tokens (the matmuls are most of a prefill), so
# prompts of 16-32 tokens in one 32-wide forward do ~1/3 more work than they need; a few more forwards cost
# far less than that. (Jobs run longest first, so the width is the group's first chunk.) Up to ``_MAX_PAD`` padding
# tokens are always accepted: for short prompts another forward costs more than a few padded positions.
_MIN_FILL = 0.75
_MAX_PAD = 8


@dataclass(eq=False)
class PrefillJob:
    prompt: list[int]
    members: list[int] = field(default_factory=list)  # indices of the requests sharing this prompt
    rows: list[int] = field(default_factory=list)  # their cache rows
    start: int = 0  # leading prompt tokens already in the rows
    vision: Any = None  # hf_vision.VisionRequest of an image prompt (then start == 0, one chunk)


def group_prefill_jobs(reqs: list) -> tuple[list[PrefillJob], list[int]]:
    """One job per distinct prompt of ``reqs`` (GRPO's ``rollout.n`` copies share one forward row, whose K/V is
    written into every row that asked for it), and the index of each request's job."""
    index: dict[tuple, int] = {}
    jobs: list[PrefillJob] = []
    job_of: list[int] = []
    for i, req in enumerate(reqs):
        # Image prompts share a prefill only with the same pixels (the image tokens alone are all alike).
        key = (tuple(req.prompt_ids), req.vision.key if req.vision is not None else None)
        if key not in index:
            index[key] = len(jobs)
            jobs.append(PrefillJob(req.prompt_ids, vision=req.vision))
        jobs[index[key]].members.append(i)
        job_of.append(index[key])
    return jobs, job_of


def run_prefill(model, cache: SlotKVCache, jobs: list[PrefillJob], pad_token_id: int, max_tokens: int,
                mask_dtype: torch.dtype, device, masks: EngineMasks) -> tuple[torch.Tensor, int]:
    """Prefill ``jobs`` into ``cache``; return ``(last-token logits (len(jobs), V), forwards run)``.
    ``masks`` adds the model's sliding windows to the masks built here."""
    progress = [job.start for job in jobs]
    logits: list[torch.Tensor | None] = [None] * len(jobs)
    remaining = list(range(len(jobs)))
    forwards = 0
    while remaining:
        # Longest first, so a forward packs chunks of similar length (less padding).
        remaining.sort(key=lambda j: len(jobs[j].prompt) - progress[j], reverse=True)
        group: list[tuple[int, int, int]] = []
        width = 0
        for j in remaining:
            left = len(jobs[j].prompt) - progress[j]
            chunk = left if jobs[j].vision is not None else min(left, max_tokens)
            w = max(width, chunk)
            if group and ((len(group) + 1) * w > max_tokens or chunk < min(_MIN_FILL * width, width - _MAX_PAD)):
                continue
            group.append((j, progress[j], progress[j] + chunk))
            width = w
        out = _forward(model, cache, [(jobs[j], a, b) for j, a, b in group], width, pad_token_id, mask_dtype, device,
                       masks)
        forwards += 1
        for (j, _, b), row in zip(group, out):
            progress[j] = b
            if b == len(jobs[j].prompt):
                logits[j] = row
        remaining = [j for j in remaining if progress[j] < len(jobs[j].prompt)]
    return torch.stack(logits), forwards  # type: ignore[arg-type]


def _forward(model, cache: SlotKVCache, chunks: list[tuple[PrefillJob, int, int]], width: int, pad_token_id: int,
             mask_dtype: torch.dtype, device, masks: EngineMasks) -> torch.Tensor:
    """One forward over ``chunks`` (job, first, end position); returns the last-position logits (U, V)."""
    W = width
    ids = torch.tensor([[pad_token_id] * (W - (b - a)) + job.prompt[a:b] for job, a, b in chunks], device=device)
    first = torch.tensor([a for _, a, _ in chunks], device=device)
    lens = torch.tensor([b - a for _, a, b in chunks], device=device)
    pad = W - lens  # (U,) forward slots before the chunk's first token
    slots = torch.arange(W, device=device)
    valid = slots[None, :] >= pad[:, None]  # (U, W)
    positions = torch.where(valid, first[:, None] + slots[None, :] - pad[:, None], 0)
    fresh = all(a == 0 for _, a, _ in chunks)
    if fresh:  # attend over the forward's own keys: causal, not padding
        allowed = (slots[None, None, :] <= slots[None, :, None]) & (slots[None, None, :] >= pad[:, None, None])
        allowed |= torch.eye(W, dtype=torch.bool, device=device)
        read_rows, kv_len, key_positions = None, W, positions
    else:  # attend over the row's cache columns up to the query's own position
        kv_len = int((first + lens).max())
        cols = torch.arange(kv_len, device=device)
        allowed = (cols[None, None, :] <= positions[:, :, None]) | ~valid[:, :, None]
        read_rows, key_positions = torch.tensor([job.rows[0] for job, _, _ in chunks], device=device), cols
    mask = masks.prefill(allowed, positions, key_positions, valid, mask_dtype)
    model_positions, vision_inputs = _vision_inputs(chunks, positions, pad, device)
    cache.begin_extend(_writes(chunks, pad, first, lens, device), read_rows, kv_len)
    try:
        out = forward_with_cache(model, cache, input_ids=ids, attention_mask=mask,
                                 position_ids=model_positions, use_cache=True, logits_to_keep=1, **vision_inputs)
    finally:
        cache.end()
    return out.logits[:, -1]


def _vision_inputs(chunks, positions: torch.Tensor, pad: torch.Tensor, device) -> tuple[torch.Tensor, dict]:
    """(position_ids, pixel keyword arguments) of a forward: ``positions`` unchanged without image prompts."""
    rows = [(u, job.vision) for u, (job, _, _) in enumerate(chunks) if job.vision is not None]
    if not rows:
        return positions, {}
    rope = positions[None].repeat(3, 1, 1)  # (3, U, W): text rows rotate alike on every axis
    for u, vision in rows:
        rope[:, u, int(pad[u]):] = vision.positions.to(device)
    pixels = torch.cat([v.pixel_values for _, v in rows]).to(device)
    grids = torch.cat([v.image_grid_thw for _, v in rows]).to(device)
    return rope, {"pixel_values": pixels, "image_grid_thw": grids}


def _writes(chunks, pad: torch.Tensor, first: torch.Tensor, lens: torch.Tensor, device):
    """(forward row, forward slot, cache row, cache column) of every token to store: each chunk's tokens go
    to every row of its job, at columns = positions."""
    n_rows = torch.tensor([len(job.rows) for job, _, _ in chunks], device=device)
    pair_chunk = torch.repeat_interleave(torch.arange(len(chunks), device=device), n_rows)  # (P,) per (chunk, row)
    pair_row = torch.tensor([r for job, _, _ in chunks for r in job.rows], device=device)
    per_pair = lens[pair_chunk]
    src_row = torch.repeat_interleave(pair_chunk, per_pair)
    dst_row = torch.repeat_interleave(pair_row, per_pair)
    starts = torch.cumsum(per_pair, 0) - per_pair
    offset = torch.arange(int(per_pair.sum()), device=device) - torch.repeat_interleave(starts, per_pair)
    return src_row, pad[src_row] + offset, dst_row, first[src_row] + offset
