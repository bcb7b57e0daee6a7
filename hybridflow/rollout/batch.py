"""Batch front-end: a prompt ``DataProto`` in, verl's rollout layout out.

Input rows hold left-padded ``input_ids`` / ``attention_mask`` / ``position_ids`` (width P =
``data.max_prompt_length``) and optionally the unpadded ``raw_prompt_ids``.  Output rows hold (see
docs/architecture.md, "Batch keys"):

* ``prompts`` (B, P) -- the left-padded prompt, unchanged;
* ``responses`` (B, R) -- generated ids right-padded with ``pad_token_id`` to R = ``max_tokens``;
* ``response_mask`` (B, R) -- 1 on generated tokens (the stop/EOS token included), 0 on padding;
* ``input_ids`` = cat(prompts, responses), ``attention_mask`` = cat(prompt mask, response_mask),
  ``position_ids`` = cumsum(attention_mask) - 1 clipped at 0;
* ``rollout_log_probs`` (B, R) -- when ``SamplingParams.logprobs``; 0 on padding.

Who repeats for ``n``: either the caller passes each prompt once with ``n = rollout.n`` and this function
repeats rows interleaved (``[a, a, b, b]``, the n samples of a prompt adjacent, non-tensor columns
repeated too), or the caller (e.g. a trainer that has already assigned ``uid``s and repeated the batch)
passes repeated rows with ``n = 1``.  Both give the same layout.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout.base import RolloutEngine, TokenOutput
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["generate_sequences", "prompt_token_lists"]


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """Unpadded prompt ids per row: ``raw_prompt_ids`` when present, else read through the mask."""
    if "raw_prompt_ids" in prompts.non_tensor_batch:
        return [[int(t) for t in ids] for ids in prompts.non_tensor_batch["raw_prompt_ids"]]
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    return [row[m].tolist() for row, m in zip(ids, mask)]


def _check_prompt_layout(prompts: DataProto) -> None:
    for key in ("input_ids", "attention_mask"):
        if key not in prompts.batch:
            raise KeyError(f"generate_sequences: the prompt batch has no '{key}' tensor (keys: {prompts.batch.keys()})")
    mask = prompts.batch["attention_mask"]
    if mask.shape != prompts.batch["input_ids"].shape:
        raise ValueError(f"generate_sequences: attention_mask {tuple(mask.shape)} and input_ids "
                         f"{tuple(prompts.batch['input_ids'].shape)} differ in shape")
    if mask.shape[0] and not bool(mask[:, -1].all()):
        raise ValueError("generate_sequences: prompts must be left-padded (every row's last attention_mask "
                         "entry 1); tokenize with padding_side='left'")


def _pad_outputs(outputs: list[TokenOutput], width: int, pad_token_id: int, with_log_probs: bool):
    rows = [o.token_ids + [pad_token_id] * (width - len(o.token_ids)) for o in outputs]
    masks = [[1] * len(o.token_ids) + [0] * (width - len(o.token_ids)) for o in outputs]
    responses = torch.tensor(rows, dtype=torch.long).reshape(len(outputs), width)
    response_mask = torch.tensor(masks, dtype=torch.long).reshape(len(outputs), width)
    log_probs = None
    if with_log_probs:
        log_probs = torch.tensor(
            [o.log_probs + [0.0] * (width - len(o.log_probs)) for o in outputs], dtype=torch.float32
        ).reshape(len(outputs), width)
    return responses, response_mask, log_probs


def generate_sequences(
    engine: RolloutEngine,
    prompts: DataProto,
    sampling: SamplingParams,
    pad_token_id: int,
    val_sampling: SamplingParams | None = None,
) -> DataProto:
    """Generate responses for every row of ``prompts`` and return the verl rollout layout.

    ``meta_info["validate"]`` selects ``val_sampling`` (built from ``rollout.val_kwargs``) instead of
    ``sampling``.  Timing and throughput land in ``meta_info["timing"]["generate_sequences"]`` (seconds)
    and ``meta_info["rollout_stats"]`` (token counts, tokens/s, how many rows stopped on a stop token).
    """
    _check_prompt_layout(prompts)
    validate = bool(prompts.meta_info.get("validate", False))
    params = val_sampling if validate else sampling
    if params is None:
        raise ValueError("generate_sequences: meta_info['validate'] is set but no val_sampling was given; "
                         "build it with SamplingParams.from_rollout_config(rollout, validate=True)")
    if params.n > 1:
        prompts = prompts.repeat(params.n, interleave=True)
    token_lists = prompt_token_lists(prompts)

    start = time.perf_counter()
    outputs = engine.generate_batch(token_lists, replace(params, n=1))
    elapsed = time.perf_counter() - start

    device = prompts.batch["input_ids"].device
    responses, response_mask, log_probs = _pad_outputs(outputs, params.max_tokens, pad_token_id, params.logprobs)
    prompt_ids = prompts.batch["input_ids"]
    attention_mask = torch.cat([prompts.batch["attention_mask"], response_mask.to(device)], dim=1)
    tensors = {
        "prompts": prompt_ids,
        "responses": responses.to(device),
        "response_mask": response_mask.to(device),
        "input_ids": torch.cat([prompt_ids, responses.to(device)], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=-1) - 1).clamp(min=0),
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = log_probs.to(device)

    generated = int(response_mask.sum())
    meta = dict(prompts.meta_info)
    meta["timing"] = {**meta.get("timing", {}), "generate_sequences": elapsed}
    meta["rollout_stats"] = {
        "generated_tokens": generated,
        "prompt_tokens": sum(len(t) for t in token_lists),
        "tokens_per_s": generated / elapsed if elapsed > 0 else 0.0,
        "stopped": sum(o.finish_reason == "stop" for o in outputs),
        "truncated": sum(o.finish_reason == "length" for o in outputs),
    }
    return DataProto.from_dict(tensors, dict(prompts.non_tensor_batch), meta)
