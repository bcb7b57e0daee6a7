"""Finished trajectories -> verl's rollout batch layout (``DataProto``).

For each trajectory (``prompt_ids`` P_i tokens, ``response_ids`` R_i tokens, model tokens and observation
tokens interleaved)::

    prompts        (B, P)   left-padded with pad_token_id
    responses      (B, R)   right-padded; R = rollout.response_length
    response_mask  (B, R)   1 on model tokens, 0 on observation tokens and padding
    input_ids      (B, P+R) cat(prompts, responses)
    attention_mask (B, P+R) 1 on every real token (observations included: the model reads them)
    position_ids   (B, P+R) cumsum(attention_mask) - 1, clipped at 0
    rollout_log_probs (B, R)  when every trajectory has log-probs (0 on observations and padding)
    rm_scores      (B, R)   when every trajectory carries a reward_score: the score on its last model token
                            (the extra info of the scoring becomes columns named in
                            ``meta_info["reward_extra_keys"]``)

Vision-language models (``processor`` given): every row gets ``multi_modal_inputs`` (non-tensor: the pixel
inputs of the trajectory's ``multi_modal_data["image"]``, ``{}`` without images), and for the Qwen2-VL family
``position_ids`` is (B, 4, P+R): text positions, then M-RoPE over prompt and response (``data/mrope.py``) --
what the actor and the reference recompute log-probs with.

P is ``rollout.prompt_length`` or the longest prompt of the batch if longer (a tool agent's prompt holds
the tool schemas, which the dataset's length filter never saw).  Non-tensor columns: ``__num_turns__`` and every key of the
trajectories' ``extra_fields``, always including the stable set ``STABLE_EXTRA_FIELDS`` (verl's): ``turn_scores`` and
``tool_rewards`` (``[]`` for a trajectory whose loop set none), ``min_global_steps``, ``max_global_steps`` and
``extras`` (``None`` when unset), so batches of different agent loops and generation rounds share one schema and
concatenate (DAPO's extra rounds, asynchronous training).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from hybridflow.agents.base import AgentLoopOutput
from hybridflow.protocol import DataProto

__all__ = ["STABLE_EXTRA_FIELDS", "outputs_to_batch"]

# extra_fields present in every rollout batch, with the value a trajectory gets when its loop did not set them
STABLE_EXTRA_FIELDS: dict[str, object] = {"turn_scores": [], "tool_rewards": [], "min_global_steps": None,
                                          "max_global_steps": None, "extras": None}


_NUMPY = {torch.long: np.int64, torch.float32: np.float32}


def _left(rows: Sequence[Sequence[int]], width: int, fill: int) -> torch.Tensor:
    out = np.full((len(rows), width), fill, dtype=np.int64)  # filled row by row: half the cost of nested lists
    for i, r in enumerate(rows):
        if len(r):
            out[i, width - len(r):] = r
    return torch.from_numpy(out)


def _right(rows: Sequence[Sequence], width: int, fill, dtype) -> torch.Tensor:
    if dtype not in _NUMPY:
        return torch.tensor([list(r) + [fill] * (width - len(r)) for r in rows], dtype=dtype).reshape(len(rows), width)
    out = np.full((len(rows), width), fill, dtype=_NUMPY[dtype])
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = r
    return torch.from_numpy(out)


def outputs_to_batch(outputs: Sequence[AgentLoopOutput], prompt_length: int, response_length: int,
                     pad_token_id: int, processor=None) -> DataProto:
    """Stack ``outputs`` into the rollout layout above (rows in the given order)."""
    for i, out in enumerate(outputs):
        if len(out.response_ids) > response_length or len(out.response_mask) != len(out.response_ids):
            raise ValueError(f"trajectory {i}: {len(out.response_ids)} response tokens with {len(out.response_mask)} "
                             f"mask entries; an agent loop must return equal lengths within "
                             f"rollout.response_length={response_length}")
        if out.response_logprobs is not None and len(out.response_logprobs) != len(out.response_ids):
            raise ValueError(f"trajectory {i}: {len(out.response_logprobs)} log-probs for {len(out.response_ids)} "
                             "response tokens; give one per token (0.0 on observation tokens)")
    width = max([prompt_length, *(len(o.prompt_ids) for o in outputs)])
    prompts = _left([o.prompt_ids for o in outputs], width, pad_token_id)
    prompt_mask = _left([[1] * len(o.prompt_ids) for o in outputs], width, 0)
    responses = _right([o.response_ids for o in outputs], response_length, pad_token_id, torch.long)
    response_mask = _right([o.response_mask for o in outputs], response_length, 0, torch.long)
    response_attention = _right([[1] * len(o.response_ids) for o in outputs], response_length, 0, torch.long)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask * response_attention,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=-1) - 1).clamp(min=0),
    }
    non_tensors: dict[str, np.ndarray] = {"__num_turns__": np.array([o.num_turns for o in outputs], dtype=np.int64)}
    _vision_columns(outputs, tensors, non_tensors, processor)
    if outputs and all(o.response_logprobs is not None for o in outputs):
        tensors["rollout_log_probs"] = _right([o.response_logprobs for o in outputs], response_length, 0.0,
                                              torch.float32)
    if outputs and all(o.reward_score is not None for o in outputs):
        from hybridflow.rewards.managers import reward_positions

        rm_scores = torch.zeros(len(outputs), response_length, dtype=torch.float32)
        last = reward_positions(tensors["response_mask"], response_attention.sum(dim=1).tolist())
        rm_scores[torch.arange(len(outputs)), torch.tensor(last)] = torch.tensor([float(o.reward_score) for o in outputs])
        tensors["rm_scores"] = rm_scores
    for key in sorted({k for o in outputs for k in o.extra_fields} - {"reward_extra_info"} | set(STABLE_EXTRA_FIELDS)):
        default = STABLE_EXTRA_FIELDS.get(key)
        non_tensors[key] = _column([o.extra_fields.get(key, list(default) if isinstance(default, list) else default)
                                    for o in outputs])
    meta: dict = {}
    if "rm_scores" in tensors:  # scored in the agent loops: their extra info becomes columns, as a manager's does
        infos = [o.extra_fields.get("reward_extra_info") or {} for o in outputs]
        keys = sorted({k for info in infos for k in info})
        non_tensors.update({k: _column([info.get(k) for info in infos]) for k in keys})
        meta["reward_extra_keys"] = keys
    return DataProto.from_dict(tensors, non_tensors, meta)


def _vision_columns(outputs: Sequence[AgentLoopOutput], tensors: dict, non_tensors: dict, processor) -> None:
    """``multi_modal_inputs`` and M-RoPE ``position_ids`` of a vision-language batch (see the module doc)."""
    images = [list((o.multi_modal_data or {}).get("image") or []) for o in outputs]
    if processor is None:
        with_images = [i for i, imgs in enumerate(images) if imgs]
        if with_images:
            raise ValueError(f"trajectory {with_images[0]} carries {len(images[with_images[0]])} image(s) in "
                             "multi_modal_data but the model has no multimodal processor (a text-only model); use a "
                             "vision-language checkpoint or drop the images")
        return
    from hybridflow.data.mrope import spec_from_processor, vlm_position_ids

    # the n samples of a prompt carry the same image objects: each distinct list is processed once
    processed: dict[tuple[int, ...], dict] = {}
    inputs = []
    for imgs in images:
        key = tuple(id(img) for img in imgs)
        if imgs and key not in processed:
            processed[key] = dict(processor.image_processor(images=imgs, return_tensors="pt"))
        inputs.append(dict(processed[key]) if imgs else {})
    non_tensors["multi_modal_inputs"] = _column(inputs)
    spec = spec_from_processor(processor)
    if spec is not None:
        ids, mask = tensors["input_ids"], tensors["attention_mask"]
        tensors["position_ids"] = torch.stack([
            vlm_position_ids(ids[i], mask[i], spec, inputs[i].get("image_grid_thw")) for i in range(len(outputs))])


def _column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column

