"""Exact on-policy log-probs (rollout.exact_log_probs): the hf engine's per-token log-probs equal the actor's
recomputation bit for bit on CPU fp32, in every layout the actor uses; the cached path does not."""

from __future__ import annotations

import pytest
import torch

from hybridflow.engine.forward import ALIGNED, response_token_outputs
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine

TEMPERATURE = 0.7


def _generate(model, tok, prompts, exact: bool):
    engine = HFRolloutEngine(model, tok, seed=5, exact_log_probs=exact)
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=10, logprobs=True)
    return engine.generate_batch([p for p in prompts for _ in range(3)], params)  # 3 samples per prompt


def _actor_batch(prompts, outs, pad_id: int):
    return _actor_batch_rows([p for p in prompts for _ in range(3)], outs, pad_id)


def _actor_batch_rows(prompts, outs, pad_id: int):
    """verl's layout: prompts left-padded, responses right-padded."""
    width_p = max(len(p) for p in prompts)
    width_r = max(len(o.token_ids) for o in outs)
    ids = torch.full((len(outs), width_p + width_r), pad_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        ids[i, width_p - len(p):width_p] = torch.tensor(p)
        ids[i, width_p:width_p + len(o.token_ids)] = torch.tensor(o.token_ids)
        att[i, width_p - len(p):width_p + len(o.token_ids)] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": att, "position_ids": pos, "responses": ids[:, width_p:]}


def _max_diff(model, batch, outs, packed):
    with torch.no_grad():
        lp = response_token_outputs(model, batch, TEMPERATURE, use_remove_padding=True, packed=packed)["log_probs"]
    diffs = [(lp[i, :len(o.log_probs)] - torch.tensor(o.log_probs)).abs().max() for i, o in enumerate(outs)]
    return torch.stack(diffs).max().item()


@pytest.fixture(scope="module")
def prompts(model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    return [tok.encode(t) for t in prompt_texts]


def test_exact_rollout_log_probs_equal_the_actor_recomputation_bit_for_bit(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    torch.set_num_threads(1)
    outs = _generate(model, tok, prompts, exact=True)
    assert sum(len(o.token_ids) for o in outs) > 3 * len(prompts)  # real responses, of several lengths
    assert len({len(o.token_ids) for o in outs}) > 1
    batch = _actor_batch(prompts, outs, tok.pad_token_id)
    assert _max_diff(model, batch, outs, ALIGNED) == 0.0
    # the same rows in another order and with other neighbours: still exact (batch invariance)
    order = list(reversed(range(len(outs))))
    sub = [outs[i] for i in order[::2]]
    sub_prompts = [[p for p in prompts for _ in range(3)][i] for i in order[::2]]
    assert _max_diff(model, _actor_batch_rows(sub_prompts, sub, tok.pad_token_id), sub, ALIGNED) == 0.0


def test_the_other_layouts_differ_in_the_last_bits(model_and_tokenizer, prompts):
    """Why the aligned layout: in the packed and the left-padded trimmed layouts a row's attention blocks
    depend on its place in the batch."""
    model, tok = model_and_tokenizer
    torch.set_num_threads(1)
    outs = _generate(model, tok, prompts, exact=True)
    batch = _actor_batch(prompts, outs, tok.pad_token_id)
    assert max(_max_diff(model, batch, outs, True), _max_diff(model, batch, outs, False)) > 0.0


def test_the_cached_decode_is_close_but_not_exact(model_and_tokenizer, prompts):
    """Why exact mode exists: the cached decode's arithmetic differs from the full forward's in the last bits."""
    model, tok = model_and_tokenizer
    torch.set_num_threads(1)
    outs = _generate(model, tok, prompts, exact=False)
    diff = _max_diff(model, _actor_batch(prompts, outs, tok.pad_token_id), outs, ALIGNED)
    assert 0.0 < diff < 1e-4


def test_exact_sampling_is_reproducible_and_samples(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    a = [o.token_ids for o in _generate(model, tok, prompts, exact=True)]
    b = [o.token_ids for o in _generate(model, tok, prompts, exact=True)]
    assert a == b
    assert len({tuple(t) for t in a}) > len(prompts)  # samples of one prompt differ: it samples, not argmax
