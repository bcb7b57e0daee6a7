"""The hf engine's KV cache: sized by the requests in flight (not max_num_seqs x full length), bounded by
max_num_seqs / max_model_len / the memory budget, freed at sleep, stored in the compute dtype."""

from __future__ import annotations

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.batcher import BatcherLimits, ContinuousBatcher, GenerationRequest
from hybridflow.rollout.hf.engine import HFRolloutEngine, rollout_compute_dtype
from hybridflow.rollout.hf.kv_cache import KVGeometry


@pytest.fixture(scope="module")
def prompts(model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    return [tok.encode(t) for t in prompt_texts]


def greedy(m, **kw):
    return SamplingParams(do_sample=False, max_tokens=m, ignore_eos=True, **kw)


def test_cache_is_sized_by_the_batch_not_by_max_num_seqs(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, max_num_seqs=1024)
    engine.generate_batch(prompts, greedy(10))
    stats = engine.stats()
    geometry = KVGeometry.from_config(model.config, torch.float32)
    assert stats["kv_cache_rows"] == 8  # 6 requests, rounded up to 8 rows -- not 1024
    assert stats["kv_cache_columns"] == 64  # longest prompt (24) + 10 tokens, rounded up to a power of two
    assert stats["kv_cache_bytes"] == 8 * 64 * geometry.bytes_per_token == engine.kv_cache_bytes
    # 2 layers x (K, V) x 2 kv heads x 16 head_dim x 4 bytes
    assert geometry.bytes_per_token == 2 * 2 * 2 * 16 * 4


def test_short_sequences_get_a_narrow_cache_that_grows_when_longer_ones_come(model_and_tokenizer, prompts):
    """Widths: a power of two from 16 to 64, then multiples of 64 (the cache is zero-filled at every allocation:
    128 rows of 12-token sequences do not pay for 64 columns)."""
    from hybridflow.rollout.hf.kv_cache import cache_columns

    assert [cache_columns(n) for n in (1, 12, 16, 17, 33, 64, 65, 130)] == [16, 16, 16, 32, 64, 64, 128, 192]
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    short = [p[:4] for p in prompts]
    outs = engine.generate_batch(short, greedy(4))
    assert engine.stats()["kv_cache_columns"] == 16
    longer = engine.generate_batch(short, greedy(30))  # the same rows need 34 columns now
    assert engine.stats()["kv_cache_columns"] == 64
    ref = HFRolloutEngine(model, tok, max_num_seqs=64)
    assert [o.token_ids for o in outs] == [o.token_ids[:4] for o in longer]
    assert [o.token_ids for o in longer] == [o.token_ids for o in ref.generate_batch(short, greedy(30))]


def test_rows_grow_while_requests_join_and_are_bounded_by_max_num_seqs(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, max_num_seqs=12, enable_prefix_caching=False)
    batcher = engine._batcher
    done = []
    request = lambda p, m, i: engine._request(p, greedy(m), f"r{i}", done.append, None)  # noqa: E731
    batcher.submit(request(prompts[0], 30, 0))
    engine._locked_step()
    assert batcher.cache.max_rows == 8 and len(batcher.reqs) == 1
    for i in range(14):  # 15 requests in all, 12 may decode at once
        batcher.submit(request(prompts[i % 6], 30, i + 1))
    engine._locked_step()
    assert len(batcher.reqs) == 12 and len(batcher.pending) == 3
    assert batcher.cache.max_rows == 12  # grew (x1.5 -> 12), capped by max_num_seqs
    while batcher.has_work():
        engine._locked_step()
    assert len(done) == 15 and all(len(o.token_ids) == 30 for o in done)
    ref = HFRolloutEngine(model, tok).generate_batch([prompts[0]] + [prompts[i % 6] for i in range(14)], greedy(30))
    by_id = {o.request_id: o.token_ids for o in done}
    assert [by_id[f"r{i}"] for i in range(15)] == [o.token_ids for o in ref]


def test_max_model_len_refuses_a_request_that_cannot_fit(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, max_model_len=20)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.max_model_len=20"):
        engine.generate_batch([prompts[2]], greedy(16))  # 24 prompt tokens + 16
    with pytest.raises(ValueError, match="max_model_len"):  # all or nothing: the good one is not left queued
        engine.generate_batch([prompts[0], prompts[2]], greedy(16))
    assert not engine._batcher.has_work()
    out = engine.generate_batch([prompts[0]], greedy(16))[0]  # 4 + 16 fits exactly
    assert len(out.token_ids) == 16
    default = HFRolloutEngine(model, tok)  # unset: the model's max_position_embeddings
    with pytest.raises(ValueError, match="max_position_embeddings"):
        default.generate_batch([prompts[0]], greedy(model.config.max_position_embeddings))


def test_sleep_frees_the_cache_with_free_cache_engine_and_keeps_it_without(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    freeing = HFRolloutEngine(model, tok, free_cache_engine=True)
    keeping = HFRolloutEngine(model, tok, free_cache_engine=False)
    outs = []
    for engine in (freeing, keeping):
        outs.append(engine.generate_batch(prompts[:3], greedy(8)))
        assert engine.kv_cache_bytes > 0 and engine.stats()["parked_rows"] == 3
        engine.sleep()
        assert engine.stats()["parked_rows"] == 0  # parked K/V belong to the weights about to change
        with pytest.raises(RuntimeError, match="wake_up"):
            engine.generate_batch(prompts[:1], greedy(4))
    assert freeing.kv_cache_bytes == 0 and keeping.kv_cache_bytes > 0
    for engine, before in zip((freeing, keeping), outs):
        engine.wake_up()
        assert [o.token_ids for o in engine.generate_batch(prompts[:3], greedy(8))] == [o.token_ids for o in before]
    assert freeing.kv_cache_bytes > 0


def test_memory_budget_bounds_rows_and_explains_a_row_that_cannot_fit(model_and_tokenizer, prompts, monkeypatch):
    """The CUDA budget (gpu_memory_utilization x free memory) as the batcher applies it; the device query is
    replaced by fixed numbers because this machine has no GPU (tests/gpu checks the real one)."""
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, enable_prefix_caching=False)
    batcher = engine._batcher
    per_row = 64 * batcher.geometry.bytes_per_token  # one row of 64 columns
    monkeypatch.setattr(batcher, "_budget_bytes", lambda: 3 * per_row)
    outs = engine.generate_batch(prompts, greedy(12))  # 6 requests, 3 rows' worth of memory
    assert batcher.cache.max_rows == 3 and [len(o.token_ids) for o in outs] == [12] * 6
    ref = HFRolloutEngine(model, tok).generate_batch(prompts, greedy(12))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    engine.sleep()
    engine.wake_up()
    monkeypatch.setattr(batcher, "_budget_bytes", lambda: per_row // 8)  # less than the narrowest row (16 columns)
    with pytest.raises(MemoryError, match="gpu_memory_utilization"):
        engine.generate_batch(prompts[:1], greedy(12))


def test_compute_dtype_policy():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert rollout_compute_dtype("bfloat16", cpu) == torch.float32  # CPU computes like the actor: fp32
    assert rollout_compute_dtype("bfloat16", cuda) == torch.bfloat16
    assert rollout_compute_dtype("fp16", cuda) == torch.float16
    assert rollout_compute_dtype(None, cuda, torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="rollout.dtype"):
        rollout_compute_dtype("float32", cuda, torch.bfloat16)
    with pytest.raises(ValueError, match="not a known dtype"):
        rollout_compute_dtype("bf17", cuda)


def test_bf16_compute_stores_bf16_kv_and_stays_close_to_fp32(model_and_tokenizer, prompts):
    """The autocast path (what CUDA runs with rollout.dtype=bfloat16), exercised on CPU through the batcher."""
    model, tok = model_and_tokenizer
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        for fast in (True, False):
            batcher = ContinuousBatcher(model, tok.pad_token_id, torch.Generator().manual_seed(0),
                                        BatcherLimits(), compute_dtype=dtype, fast_decode=fast)
            outs = {}
            for i, p in enumerate(prompts):
                batcher.submit(GenerationRequest(f"r{i}", p, greedy(8, logprobs=True),
                                                 lambda o: outs.__setitem__(o.request_id, o), None))
            while batcher.has_work():
                batcher.step()
            results[dtype, fast] = [outs[f"r{i}"] for i in range(len(prompts))]
            assert batcher.cache.keys[0].dtype == dtype
    bf16_fast, bf16_slow = results[torch.bfloat16, True], results[torch.bfloat16, False]
    assert [o.token_ids for o in bf16_fast] == [o.token_ids for o in bf16_slow]  # lean decode == forward
    fp32 = results[torch.float32, True]
    first = torch.tensor([o.log_probs[0] for o in bf16_fast]) - torch.tensor([o.log_probs[0] for o in fp32])
    assert first.abs().max() < 0.5  # same tokens scored in bf16 (this model has large logits): close, not equal
    assert bool((first != 0).any())  # and really computed in bf16
    assert HFRolloutEngine(model, tok, dtype="bfloat16").compute_dtype == torch.float32  # CPU policy


def test_kv_geometry_of_qwen25_05b_shape():
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
    geometry = KVGeometry.from_config(cfg, torch.bfloat16)
    assert geometry.bytes_per_token == 2 * 24 * 2 * 64 * 2  # 12 KiB per token
