"""Helpers for reward tests: a char tokenizer and a generated batch built by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto


@pytest.fixture(scope="session")
def char_tokenizer():
    from hybridflow.utils.tiny_model import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def make_batch():
    """Builds a post-rollout DataProto (``make_batch(tok, prompts, responses, ground_truths, data_sources)``)."""
    return _make_batch


def _make_batch(tok, prompts: list[str], responses: list[str], ground_truths: list, data_sources: list[str],
               prompt_len: int = 8, response_len: int = 8, eos: bool = True) -> DataProto:
    """A post-rollout batch: prompts left-padded, responses (+EOS) right-padded, verl's key names."""
    pad = tok.pad_token_id
    p_rows, r_rows, masks = [], [], []
    for p, r in zip(prompts, responses):
        p_ids = tok.encode(p, add_special_tokens=False)
        r_ids = tok.encode(r, add_special_tokens=False) + ([tok.eos_token_id] if eos else [])
        r_ids = r_ids[:response_len]
        p_rows.append([pad] * (prompt_len - len(p_ids)) + p_ids)
        r_rows.append(r_ids + [pad] * (response_len - len(r_ids)))
        masks.append([0] * (prompt_len - len(p_ids)) + [1] * len(p_ids) + [1] * len(r_ids)
                     + [0] * (response_len - len(r_ids)))
    prompts_t, responses_t = torch.tensor(p_rows), torch.tensor(r_rows)
    attention = torch.tensor(masks)
    tensors = {
        "prompts": prompts_t,
        "responses": responses_t,
        "input_ids": torch.cat([prompts_t, responses_t], dim=1),
        "attention_mask": attention,
        "response_mask": attention[:, prompt_len:].clone(),
    }
    non_tensors = {
        "data_source": np.array(data_sources, dtype=object),
        "reward_model": np.array([{"style": "rule", "ground_truth": g} for g in ground_truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(len(prompts))], dtype=object),
    }
    return DataProto.from_dict(tensors, non_tensors)
