"""Partial rollout on the server: an interrupted request continues with the new weights after resume."""

from __future__ import annotations

import time

import pytest
import torch

from hybridflow.rollout import SamplingParams, create_rollout_engine
from hybridflow.rollout.weights.checkpoint_engine import full_tensors
from hybridflow.rollout.service.interruptible_server import InterruptibleRolloutServer
from hybridflow.rollout.service.server import GenerateRequest

PROMPT = [3, 4, 5, 6]
LENGTH = 120


@pytest.fixture()
def models(nano_model_dir):
    from hybridflow.engine.model_loader import load_causal_lm

    old = load_causal_lm(nano_model_dir).eval()
    new = load_causal_lm(nano_model_dir).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return old, new


def _greedy(model, prompt, length):
    engine = create_rollout_engine("hf", model=model, max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=length, ignore_eos=True, logprobs=True)
    return engine.generate_batch([prompt], params)[0]


def test_an_interrupted_request_continues_with_the_new_weights(models, nano_model_dir):
    from hybridflow.engine.model_loader import load_causal_lm

    old, new = models
    serving = load_causal_lm(nano_model_dir).eval()
    engine = create_rollout_engine("hf", model=serving, max_num_seqs=4)
    server = InterruptibleRolloutServer(engine, name="replica-test")
    try:
        params = SamplingParams(temperature=0, max_tokens=LENGTH, ignore_eos=True, logprobs=True)
        future = server.submit(GenerateRequest("r0", PROMPT, params))
        while engine.stats()["decode_steps"] < 5:  # let it generate a few tokens with the old weights
            time.sleep(0.001)
        assert server.interrupt() == 1
        assert server.interrupted
        late = server.submit(GenerateRequest("r1", PROMPT, params))  # arrives during the sync: waits
        time.sleep(0.05)
        assert not future.done() and not late.done()
        engine.update_weights(list(full_tensors(new)))  # the weight sync
        server.resume()
        out, late_out = future.result(timeout=60), late.result(timeout=60)
    finally:
        server.close()
    assert out.finish_reason == "length" and len(out.token_ids) == LENGTH and len(out.log_probs) == LENGTH
    assert server.continued == 1
    old_greedy = _greedy(old, PROMPT, LENGTH).token_ids
    k = 0
    while k < LENGTH and out.token_ids[k] == old_greedy[k]:
        k += 1
    assert 0 < k < LENGTH  # the prefix came from the old weights ...
    # every token is dated: the first segment (the old weights' tokens) is all old-greedy, the rest the new weights'
    seg = out.weight_segments
    assert len(seg) == 2 and sum(seg) == LENGTH and 0 < seg[0] <= k
    assert late_out.weight_segments is None  # one weight version: no segments
    rest = _greedy(new, PROMPT + list(out.token_ids[:k]), LENGTH - k)
    assert list(out.token_ids[k:]) == list(rest.token_ids)  # ... the rest from the new ones
    assert out.log_probs[k:] == pytest.approx(rest.log_probs, abs=1e-4)
    assert list(late_out.token_ids) == list(_greedy(new, PROMPT, LENGTH).token_ids)  # all new weights


def test_an_abort_while_running_returns_abort(models):
    old, _ = models
    engine = create_rollout_engine("hf", model=old, max_num_seqs=4)
    server = InterruptibleRolloutServer(engine, name="replica-test")
    try:
        params = SamplingParams(temperature=0, max_tokens=LENGTH, ignore_eos=True)
        future = server.submit(GenerateRequest("r0", PROMPT, params))
        while engine.stats()["decode_steps"] < 3:
            time.sleep(0.001)
        engine.abort_all()  # no interruption: the caller gets the partial output
        out = future.result(timeout=60)
    finally:
        server.close()
    assert out.finish_reason == "abort" and 0 < len(out.token_ids) < LENGTH
