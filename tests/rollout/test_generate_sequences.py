"""The batch front-end: verl's rollout layout, n-grouping, EOS padding, validation params, log-probs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout import SamplingParams, generate_sequences
from hybridflow.rollout.hf_engine import HFRolloutEngine


def prompt_batch(tok, texts, max_prompt_length=24, meta=None):
    tok.padding_side = "left"  # what the RL dataset does for prompts
    enc = tok(texts, padding="max_length", max_length=max_prompt_length, return_tensors="pt")
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        {"raw_prompt_ids": [tok.encode(t) for t in texts], "data_source": [f"src{i}" for i in range(len(texts))]},
        meta or {},
    )


@pytest.fixture(scope="module")
def tok(model_and_tokenizer):
    return model_and_tokenizer[1]


@pytest.fixture(scope="module")
def engine(model_and_tokenizer):
    model, tok = model_and_tokenizer
    return HFRolloutEngine(model, tok, seed=0)


def test_output_layout(engine, tok, prompt_texts):
    batch = prompt_batch(tok, prompt_texts)
    params = SamplingParams(temperature=1.0, max_tokens=10, logprobs=True)
    out = generate_sequences(engine, batch, params, tok.pad_token_id)
    B, P, R = len(prompt_texts), 24, 10
    assert out.batch["prompts"].shape == (B, P) and out.batch["responses"].shape == (B, R)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out.batch[key].shape == (B, P + R)
    assert out.batch["response_mask"].shape == (B, R) and out.batch["rollout_log_probs"].shape == (B, R)
    assert torch.equal(out.batch["prompts"], batch.batch["input_ids"])  # left padding kept
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))
    assert torch.equal(out.batch["attention_mask"][:, :P], batch.batch["attention_mask"])
    assert torch.equal(out.batch["attention_mask"][:, P:], out.batch["response_mask"])
    expected_pos = (out.batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    assert torch.equal(out.batch["position_ids"], expected_pos)
    assert torch.equal(out.batch["position_ids"][:, :P], batch.batch["position_ids"])
    # the first response position continues right after the last prompt token
    assert torch.equal(out.batch["position_ids"][:, P], batch.batch["attention_mask"].sum(-1))
    assert list(out.non_tensor_batch["data_source"]) == [f"src{i}" for i in range(B)]
    stats = out.meta_info["rollout_stats"]
    assert stats["generated_tokens"] == int(out.batch["response_mask"].sum()) and stats["tokens_per_s"] > 0
    assert out.meta_info["timing"]["generate_sequences"] > 0


def test_responses_stop_at_eos_with_mask_and_pad_after(model_and_tokenizer, tok, prompt_texts):
    model, _ = model_and_tokenizer
    free_engine = HFRolloutEngine(model, tok)
    batch = prompt_batch(tok, prompt_texts)
    free = generate_sequences(free_engine, batch, SamplingParams(do_sample=False, max_tokens=12, ignore_eos=True),
                              tok.pad_token_id)
    stop = int(free.batch["responses"][0, 3])  # a token row 0 is known to emit: treat it as EOS
    stop_engine = HFRolloutEngine(model, tok, eos_token_ids=[stop])
    out = generate_sequences(stop_engine, batch, SamplingParams(do_sample=False, max_tokens=12), tok.pad_token_id)
    responses, mask = out.batch["responses"], out.batch["response_mask"]
    stopped_rows = 0
    for row in range(len(prompt_texts)):
        ref = free.batch["responses"][row].tolist()
        end = ref.index(stop) + 1 if stop in ref else 12
        stopped_rows += end < 12 or ref[-1] == stop
        assert responses[row, :end].tolist() == ref[:end]
        assert mask[row, :end].tolist() == [1] * end and mask[row, end:].sum() == 0
        assert (responses[row, end:] == tok.pad_token_id).all()
    assert stopped_rows >= 1 and out.meta_info["rollout_stats"]["stopped"] == stopped_rows


def test_n_groups_are_adjacent_and_prerepeated_prompts_match(model_and_tokenizer, tok, prompt_texts):
    model, _ = model_and_tokenizer
    texts = prompt_texts[:2]
    params = SamplingParams(temperature=1.0, max_tokens=8, n=3)
    out = generate_sequences(HFRolloutEngine(model, tok, seed=4), prompt_batch(tok, texts), params, tok.pad_token_id)
    assert len(out) == 6
    assert list(out.non_tensor_batch["data_source"]) == ["src0"] * 3 + ["src1"] * 3
    for g in range(2):
        group = out.batch["prompts"][3 * g : 3 * g + 3]
        assert (group == group[0]).all()
    assert len({tuple(r) for r in out.batch["responses"][:3].tolist()}) > 1  # the samples of a group differ

    repeated = prompt_batch(tok, texts).repeat(3, interleave=True)
    same = generate_sequences(HFRolloutEngine(model, tok, seed=4), repeated,
                              SamplingParams(temperature=1.0, max_tokens=8, n=1), tok.pad_token_id)
    assert torch.equal(same.batch["input_ids"], out.batch["input_ids"])


def test_validate_uses_val_kwargs(model_and_tokenizer, tok, prompt_texts):
    model, _ = model_and_tokenizer
    train = SamplingParams(temperature=1.0, max_tokens=8, n=2)
    val = SamplingParams(do_sample=False, max_tokens=8)
    engine = HFRolloutEngine(model, tok, seed=1)
    batch = prompt_batch(tok, prompt_texts[:3], meta={"validate": True})
    out = generate_sequences(engine, batch, train, tok.pad_token_id, val_sampling=val)
    greedy = engine.generate_batch([tok.encode(t) for t in prompt_texts[:3]], val)
    assert len(out) == 3
    for row, ref in enumerate(greedy):
        assert out.batch["responses"][row, : len(ref.token_ids)].tolist() == ref.token_ids
    assert out.meta_info["validate"] is True
    with pytest.raises(ValueError, match="val_sampling"):
        generate_sequences(engine, batch, train, tok.pad_token_id)


def test_rollout_log_probs_match_actor_style_recomputation(model_and_tokenizer, tok, prompt_texts):
    """What the actor does: one padded forward over input_ids/attention_mask/position_ids, logits / T."""
    model, _ = model_and_tokenizer
    temperature = 0.8
    params = SamplingParams(temperature=temperature, top_k=20, max_tokens=10, logprobs=True)
    out = generate_sequences(HFRolloutEngine(model, tok, seed=2), prompt_batch(tok, prompt_texts), params,
                             tok.pad_token_id)
    P = out.batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=out.batch["input_ids"], attention_mask=out.batch["attention_mask"],
                       position_ids=out.batch["position_ids"]).logits
    logits = logits[:, P - 1 : -1] / temperature
    recomputed = torch.log_softmax(logits, -1).gather(2, out.batch["responses"][..., None]).squeeze(-1)
    mask = out.batch["response_mask"].bool()
    diff = (recomputed - out.batch["rollout_log_probs"]).abs()[mask]
    assert diff.mean().item() < 1e-5, diff.max()
    assert (out.batch["rollout_log_probs"][~mask] == 0).all()


def test_right_padded_prompts_are_rejected(engine, tok):
    ids = torch.tensor([[5, 6, 7, tok.pad_token_id]])
    mask = torch.tensor([[1, 1, 1, 0]])
    batch = DataProto.from_dict({"input_ids": ids, "attention_mask": mask}, {"x": np.array([0], dtype=object)})
    with pytest.raises(ValueError, match="left-padded"):
        generate_sequences(engine, batch, SamplingParams(max_tokens=4), tok.pad_token_id)
