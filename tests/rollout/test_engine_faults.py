"""An exception inside the hf engine reaches every waiting request, with its cause, within seconds.

Each fault is injected at one step of the continuous batcher -- admission (laying out cache rows), the
prefill forward, the decode forward, NaN logits out of prefill or decode, a KV cache whose ``update`` does not
take what transformers passes (what a transformers release changing the cache protocol does) -- while six
requests (more than ``max_num_seqs``, so some are still waiting) are in flight through a ``RolloutServer``.
Every request must fail with an :class:`EngineError` that names the replica, the phase and the original error
and carries its traceback; and the engine must serve again once the fault is gone.
"""

from __future__ import annotations

import time

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf import batcher as hf_batcher
from hybridflow.rollout.base import EngineError
from hybridflow.rollout.hf.batcher import ContinuousBatcher
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.hf.kv_cache import SlotKVCache
from hybridflow.rollout.service.server import GenerateRequest, RolloutServer

FAST_S = 5.0


def _raise(message):
    def fault(*args, **kwargs):
        raise RuntimeError(message)

    return fault


def _nan_sampler(phase: str):
    """sample_next_tokens with NaN logits while the batcher is in ``phase`` (its own ``doing``)."""
    real = hf_batcher.sample_next_tokens
    state = {"batcher": None}

    def sample(logits, *args, **kwargs):
        doing = state["batcher"].doing if state["batcher"] is not None else ""
        if doing.startswith(phase):
            logits = torch.full_like(logits, float("nan"))
        return real(logits, *args, **kwargs)

    return sample, state


def _inject(monkeypatch, fault: str, engine: HFRolloutEngine) -> str:
    """Install ``fault``; returns a text the error must contain."""
    if fault == "admission":
        monkeypatch.setattr(ContinuousBatcher, "_layout", _raise("injected admission fault"))
        return "during admission"
    if fault == "prefill":
        monkeypatch.setattr(hf_batcher, "run_prefill", _raise("CUDA out of memory (injected)"))
        return "during prefill"
    if fault == "decode":
        monkeypatch.setattr(ContinuousBatcher, "_decode", _raise("injected decode fault"))
        return "during decode"
    if fault in ("nan_prefill", "nan_decode"):
        sample, state = _nan_sampler(fault.removeprefix("nan_"))
        state["batcher"] = engine._batcher
        monkeypatch.setattr(hf_batcher, "sample_next_tokens", sample)
        return "non-finite logits"
    if fault == "cache_signature":
        def update(self, key_states, value_states, *, kwargs=None):  # not what transformers calls
            raise AssertionError("never reached")

        monkeypatch.setattr(SlotKVCache, "update", update)
        return "TypeError"
    raise ValueError(fault)


FAULTS = ["admission", "prefill", "decode", "nan_prefill", "nan_decode", "cache_signature"]
PHASE = {"admission": "admission", "prefill": "prefill", "decode": "decode", "nan_prefill": "prefill",
         "nan_decode": "decode", "cache_signature": "prefill"}


@pytest.fixture()
def engine(model_and_tokenizer):
    model, tok = model_and_tokenizer
    eng = HFRolloutEngine(model, tok, max_num_seqs=4, name="faulty", fast_decode=True)
    yield eng


def _requests(tok, texts, seeded=True):
    return [GenerateRequest(f"r{i}", tok.encode(t), SamplingParams(max_tokens=6, ignore_eos=True,
                                                                   seed=i if seeded else None))
            for i, t in enumerate(texts)]


@pytest.mark.parametrize("fault", FAULTS)
def test_every_waiting_request_gets_the_engine_error_with_its_cause(fault, engine, model_and_tokenizer,
                                                                     prompt_texts, monkeypatch):
    _, tok = model_and_tokenizer
    cause = _inject(monkeypatch, fault, engine)
    server = RolloutServer(engine, name="replica-7", stall_timeout_s=60)
    try:
        start = time.monotonic()
        futures = server.submit_many(_requests(tok, prompt_texts))  # 6 requests, 4 rows: 2 wait in the queue
        errors = [f.exception(timeout=30) for f in futures]
        elapsed = time.monotonic() - start
        assert elapsed < FAST_S, elapsed
        assert len({id(e) for e in errors}) == 1  # one failure, handed to every request
        error = errors[0]
        assert isinstance(error, EngineError), repr(error)
        text = str(error)
        assert "rollout replica 'replica-7'" in text and "rollout engine 'faulty'" in text
        assert cause in text and f"during {PHASE[fault]}" in text
        assert "--- engine traceback ---" in text and "Traceback (most recent call last)" in text
        assert "request(s) in flight" in text
        monkeypatch.undo()  # the fault is gone: the same engine serves again, from a clean batch
        again = server.submit_many(_requests(tok, prompt_texts[:2]))
        assert [len(f.result(timeout=30).token_ids) for f in again] == [6, 6]
    finally:
        server.close()


@pytest.mark.parametrize("fault", ["prefill", "nan_decode", "cache_signature"])
def test_the_synchronous_path_raises_the_engine_error(fault, engine, model_and_tokenizer, prompt_texts, monkeypatch):
    _, tok = model_and_tokenizer
    cause = _inject(monkeypatch, fault, engine)
    with pytest.raises(EngineError, match=cause):
        engine.generate_batch([tok.encode(t) for t in prompt_texts], SamplingParams(max_tokens=6, ignore_eos=True))


def test_unseeded_nan_logits_are_named_too(engine, model_and_tokenizer, prompt_texts, monkeypatch):
    """The Gumbel path (no per-request seed) samples from NaN logits without an index error; the log-prob check
    names the cause all the same."""
    _, tok = model_and_tokenizer
    _inject(monkeypatch, "nan_decode", engine)
    with pytest.raises(EngineError, match="non-finite logits.*diverged"):
        engine.generate_batch([tok.encode(t) for t in prompt_texts], SamplingParams(max_tokens=6, ignore_eos=True))


def test_a_request_refused_on_its_own_fails_alone(engine, model_and_tokenizer):
    """A bad request (longer than the model) is not an engine failure: it raises a plain ValueError, and the
    engine keeps serving the others."""
    _, tok = model_and_tokenizer
    server = RolloutServer(engine, name="replica-8", stall_timeout_s=60)
    try:
        bad = GenerateRequest("bad", [1] * 10_000, SamplingParams(max_tokens=4))
        good = _requests(tok, ["1+2="])[0]
        futures = server.submit_many([bad, good])
        assert isinstance(futures[0].exception(timeout=30), ValueError)
        assert not isinstance(futures[0].exception(), EngineError)
        assert len(futures[1].result(timeout=30).token_ids) == 6
    finally:
        server.close()
