"""Rollout-shaped batches for a tiny Qwen2-VL: left-padded image prompts (processor-rendered) + responses.

Rows carry what the dataset and the rollout produce for a VLM: ``position_ids`` (B, 4, P+R) (text positions +
M-RoPE over prompt and response), non-tensor ``multi_modal_inputs`` (pixel_values, image_grid_thw) per row.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from hybridflow.data.mrope import MropeSpec, vlm_position_ids
from hybridflow.data.multimodal import build_messages, process_prompt
from hybridflow.protocol import DataProto
from hybridflow.engine.transformers_adapter import reset_rope_deltas

_SIZES = [(32, 32), (32, 48), (48, 32), (48, 48)]


def _image(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    h, w = _SIZES[seed % len(_SIZES)]
    return Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))


def make_vlm_rollout_batch(processor, model_config, rows: int = 4, prompt_len: int = 56, response_len: int = 5,
                           seed: int = 0, text_only_rows=()) -> DataProto:
    spec = MropeSpec.from_hf_config(model_config)
    pad = processor.tokenizer.pad_token_id
    g = torch.Generator().manual_seed(seed)
    ids, masks, poss, mms, resps, rmasks = [], [], [], [], [], []
    for i in range(rows):
        images = [] if i in text_only_rows else [_image(seed * 31 + i)]
        content = ("<image>" if images else "") + "colour?"
        msgs = build_messages([{"role": "user", "content": content}], images, [])
        prompt = process_prompt(processor, msgs, images, [], {}, f"row {i}")
        p = prompt.input_ids
        assert len(p) <= prompt_len, len(p)
        r = int(torch.randint(1, response_len + 1, (1,), generator=g))
        resp = torch.randint(5, 60, (r,), generator=g).tolist()
        prompt_ids = [pad] * (prompt_len - len(p)) + p
        response_ids = resp + [pad] * (response_len - r)
        full = torch.tensor(prompt_ids + response_ids)
        mask = torch.tensor([0] * (prompt_len - len(p)) + [1] * (len(p) + r) + [0] * (response_len - r))
        grid = prompt.multi_modal_inputs.get("image_grid_thw")
        ids.append(full)
        masks.append(mask)
        poss.append(vlm_position_ids(full, mask, spec, grid))
        mms.append(prompt.multi_modal_inputs)
        resps.append(torch.tensor(response_ids))
        rmasks.append(torch.tensor([1] * r + [0] * (response_len - r)))
    input_ids = torch.stack(ids)
    mm = np.empty(rows, dtype=object)
    for i, m in enumerate(mms):
        mm[i] = m
    return DataProto.from_dict(
        {"prompts": input_ids[:, :prompt_len], "responses": torch.stack(resps), "response_mask": torch.stack(rmasks),
         "input_ids": input_ids, "attention_mask": torch.stack(masks), "position_ids": torch.stack(poss)},
        non_tensors={"multi_modal_inputs": mm},
    )


def make_vlm_update_batch(processor, model_config, seed: int, rows: int = 8, text_only_rows=()) -> DataProto:
    data = make_vlm_rollout_batch(processor, model_config, rows=rows, seed=seed, text_only_rows=text_only_rows)
    g = torch.Generator().manual_seed(seed + 100)
    data.batch["advantages"] = torch.randn(rows, data.batch["responses"].shape[1], generator=g)
    data.meta_info["temperature"] = 0.9
    return data


def hf_reference_log_probs(model, processor, data: DataProto) -> torch.Tensor:
    """Response log-probs from the HF model computing its own positions (mm_token_type_ids, no position_ids)."""
    b = data.batch
    R = b["responses"].shape[1]
    mm = [m for m in data.non_tensor_batch["multi_modal_inputs"] if m]
    kwargs = {}
    if mm:
        kwargs = {"pixel_values": torch.cat([m["pixel_values"] for m in mm]),
                  "image_grid_thw": torch.cat([m["image_grid_thw"] for m in mm])}
    token_types = (b["input_ids"] == processor.image_token_id).long()
    reset_rope_deltas(model)
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], mm_token_type_ids=token_types,
                   use_cache=False, **kwargs).logits
    logits = logits[:, -R - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
