"""Prefix reuse across agent turns and chunked prefill: the same tokens as computing everything, less
prefill work, bounded parked rows, and no reuse across a weight change."""

from __future__ import annotations

import copy

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.hf.prefix_pool import PrefixPool


@pytest.fixture(scope="module")
def prompts(model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    return [tok.encode(t) for t in prompt_texts]


def greedy(m=8):
    return SamplingParams(do_sample=False, max_tokens=m, ignore_eos=True, logprobs=True)


def seeded(seed, m=8):
    return SamplingParams(temperature=1.0, top_p=0.9, max_tokens=m, ignore_eos=True, logprobs=True, seed=seed)


def run_turns(engine, tok, first_prompts, params, observations, turns=3):
    """Agent-loop shape: turn k+1's prompt = turn k's prompt + its response + an observation."""
    history = [list(p) for p in first_prompts]
    outputs = []
    for turn in range(turns):
        outs = engine.generate_batch(history, [params(i, turn) for i in range(len(history))])
        outputs.append(outs)
        history = [h + o.token_ids + tok.encode(observations[(i + turn) % len(observations)])
                   for i, (h, o) in enumerate(zip(history, outs))]
    return outputs


def assert_same(a_turns, b_turns):
    for a_outs, b_outs in zip(a_turns, b_turns):
        assert [o.token_ids for o in a_outs] == [o.token_ids for o in b_outs]
        for a, b in zip(a_outs, b_outs):
            assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-4)


OBS = ["<obs>42</obs>", " ok", "<tool_response>none of that</tool_response>", "?"]


@pytest.mark.parametrize("mode", ["greedy", "seeded"])
def test_three_turns_reuse_prefixes_and_give_the_same_tokens(model_and_tokenizer, prompts, mode):
    model, tok = model_and_tokenizer
    params = (lambda i, t: greedy()) if mode == "greedy" else (lambda i, t: seeded(100 * i + t))
    on = HFRolloutEngine(model, tok, enable_prefix_caching=True, seed=1)
    off = HFRolloutEngine(model, tok, enable_prefix_caching=False, seed=2)
    with_reuse, without = run_turns(on, tok, prompts[:4], params, OBS), run_turns(off, tok, prompts[:4], params, OBS)
    assert_same(with_reuse, without)
    s_on, s_off = on.stats(), off.stats()
    assert s_on["prompt_tokens"] == s_off["prompt_tokens"]
    # every turn after the first reuses prompt + response but the response's last token
    reusable = sum(len(p) + len(o.token_ids) - 1 for outs, ps in zip(with_reuse[:-1], _prompts_of(with_reuse, prompts[:4], tok))
                   for p, o in zip(ps, outs))
    assert s_on["prefix_reused_tokens"] == reusable and s_on["prefix_hits"] == 8
    assert s_on["prefill_tokens"] == s_off["prefill_tokens"] - reusable
    assert s_off["prefix_reused_tokens"] == 0


def _prompts_of(turn_outputs, first, tok):
    history, out = [list(p) for p in first], []
    for turn, outs in enumerate(turn_outputs):
        out.append(history)
        history = [h + o.token_ids + tok.encode(OBS[(i + turn) % len(OBS)]) for i, (h, o) in enumerate(zip(history, outs))]
    return out


def _one_forward_whatever_the_lengths(monkeypatch):
    """Let every chunk join the widest one (the engine otherwise splits unlike lengths to save padding), so that
    one forward mixes lengths -- what these tests check."""
    from hybridflow.rollout.hf import prefill as hf_prefill

    monkeypatch.setattr(hf_prefill, "_MIN_FILL", 0.0)
    monkeypatch.setattr(hf_prefill, "_MAX_PAD", 10**9)


def test_rows_with_different_suffix_lengths_extend_in_one_forward(model_and_tokenizer, prompts, monkeypatch):
    _one_forward_whatever_the_lengths(monkeypatch)
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    first = engine.generate_batch(prompts[:4], greedy(6))
    second = [p + o.token_ids + tok.encode(OBS[i]) for i, (p, o) in enumerate(zip(prompts[:4], first))]
    before = engine.stats()
    outs = engine.generate_batch(second, greedy(6))
    after = engine.stats()
    assert after["prefill_forwards"] - before["prefill_forwards"] == 1  # 4 rows, suffixes of 14, 3, 42, 1 tokens
    assert after["prefix_hits"] - before["prefix_hits"] == 4
    ref = HFRolloutEngine(model, tok, enable_prefix_caching=False).generate_batch(second, greedy(6))
    assert_same([outs], [ref])


def test_chunked_prefill_matches_one_forward(model_and_tokenizer, prompts, monkeypatch):
    _one_forward_whatever_the_lengths(monkeypatch)
    model, tok = model_and_tokenizer
    long = [p + p[::-1] + p for p in prompts]  # 12..75 tokens
    whole = HFRolloutEngine(model, tok, max_num_batched_tokens=8192)
    chunked = HFRolloutEngine(model, tok, max_num_batched_tokens=16)
    a = whole.generate_batch(long, greedy(10))
    shapes = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: shapes.append(tuple(kw["input_ids"].shape)),
                                           with_kwargs=True)
    try:
        b = chunked.generate_batch(long, greedy(10))
    finally:
        hook.remove()
    assert shapes and all(u * w <= 16 for u, w in shapes)  # only prefill goes through forward (lean decode)
    assert_same([a], [b])
    assert whole.stats()["prefill_forwards"] == 1
    # no forward holds more than 16 (padded) tokens, so the 6 prompts took at least total/16 forwards
    assert chunked.stats()["prefill_forwards"] >= -(-sum(len(p) for p in long) // 16) > 6
    assert chunked.stats()["prefill_tokens"] == whole.stats()["prefill_tokens"] == sum(len(p) for p in long)


def test_parked_rows_are_bounded_and_evicted_least_recently_used(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, max_num_seqs=4)
    outs = engine.generate_batch(prompts, greedy(5))  # 6 trajectories through 4 rows
    stats = engine.stats()
    assert stats["kv_cache_rows"] == 4 and stats["parked_rows"] <= 4 and stats["evicted"] >= 2
    # the most recently finished are still parked and reused; the rest are prefilled again -- same tokens
    second = [p + o.token_ids + tok.encode(" next") for p, o in zip(prompts, outs)]
    again = engine.generate_batch(second, greedy(5))
    assert engine.stats()["prefix_hits"] >= 1
    ref = HFRolloutEngine(model, tok, enable_prefix_caching=False).generate_batch(second, greedy(5))
    assert_same([again], [ref])


def test_turns_joining_while_other_rows_decode(model_and_tokenizer, prompts):
    """Rows finish at different times (compaction moves parked rows out of the decode region) and the next
    turns join while long rows are still decoding."""
    model, tok = model_and_tokenizer
    budgets = [3, 40, 4, 40, 5, 6]

    def run(cache):
        engine = HFRolloutEngine(model, tok, enable_prefix_caching=cache)
        results = {}
        def submit(prompt, m, rid):
            engine._batcher.submit(engine._request(prompt, greedy(m), rid, lambda o: results.__setitem__(o.request_id, o), None))
        for i, (p, m) in enumerate(zip(prompts, budgets)):
            submit(p, m, f"t1-{i}")
        followed, steps = set(), 0
        while engine._batcher.has_work():
            engine._locked_step()
            steps += 1
            for i in (0, 2, 4, 5):  # 0 and 2 continue as soon as their first turn is back; 4 and 5 wait
                late = i in (4, 5) and steps < 20  # until compaction has moved their parked rows
                if f"t1-{i}" in results and i not in followed and not late:
                    followed.add(i)
                    submit(prompts[i] + results[f"t1-{i}"].token_ids + tok.encode(OBS[i % 4]), 7, f"t2-{i}")
        return engine, results

    on, with_reuse = run(True)
    _, without = run(False)
    assert sorted(with_reuse) == sorted(without) and len(with_reuse) == 10
    for rid in with_reuse:
        assert with_reuse[rid].token_ids == without[rid].token_ids, rid
    assert on.stats()["prefix_hits"] == 4


def test_weight_changes_invalidate_parked_prefixes(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    model = copy.deepcopy(model)
    engine = HFRolloutEngine(model, tok)
    first = engine.generate_batch(prompts[:2], greedy(6))
    second = [p + o.token_ids + tok.encode(" more") for p, o in zip(prompts[:2], first)]
    with torch.no_grad():  # an optimizer step on the shared module, behind the engine's back
        for p in model.parameters():
            p.mul_(0.9)
    outs = engine.generate_batch(second, greedy(6))
    assert engine.stats()["prefix_hits"] == 0
    ref = HFRolloutEngine(model, tok, enable_prefix_caching=False).generate_batch(second, greedy(6))
    assert_same([outs], [ref])
    # a fused optimizer step changes the weights without bumping their version counters: still noticed
    engine.generate_batch(second, greedy(6))
    hits = engine.stats()["prefix_hits"]
    third = [p + o.token_ids + tok.encode(" again") for p, o in zip(second, outs)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    versions = [p._version for p in model.parameters()]
    model(torch.tensor([second[0]])).logits.sum().backward()
    opt.step()
    assert [p._version for p in model.parameters()] == versions
    model.zero_grad(set_to_none=True)
    outs = engine.generate_batch(third, greedy(6))
    assert engine.stats()["prefix_hits"] == hits
    ref = HFRolloutEngine(model, tok, enable_prefix_caching=False).generate_batch(third, greedy(6))
    assert_same([outs], [ref])
    # update_weights drops them too (the colocated call copies nothing but still means "new policy")
    assert engine.stats()["parked_rows"] == 2  # the third turns, parked under the new weights
    engine.update_weights(model.named_parameters())
    assert engine.stats()["parked_rows"] == 0


def test_prefix_pool_lookup():
    pool = PrefixPool()
    a = pool.park((1, 2, 3), row=0)
    b = pool.park((1, 2, 3, 4, 5), row=1)
    pool.park((9, 9), row=2)
    assert pool.lookup([1, 2, 3, 4, 5, 6]) == (b, 5)  # longest parked prefix
    assert pool.lookup([1, 2, 3, 4]) == (a, 3)
    assert pool.lookup([1, 2, 3]) == (a, 2)  # the last prompt token must still run through the model
    assert pool.lookup([1, 2]) == (None, 0) and pool.lookup([7, 1, 2, 3]) == (None, 0)
    assert [e.row for e in pool.lru()] == [2, 1, 0]  # lookups refreshed b, then a
    pool.remove(a)
    assert pool.lookup([1, 2, 3, 4]) == (None, 0) and len(pool) == 2


def test_parked_rows_survive_cache_reallocation(model_and_tokenizer, prompts):
    """A longer request (more columns) and then more requests (more rows) reallocate the cache while three
    prefixes are parked; the parked rows move with it and are still reused correctly."""
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    first = engine.generate_batch(prompts[:3], greedy(6))
    assert engine.stats()["kv_cache_rows"] == 8 and engine.stats()["kv_cache_columns"] == 32  # <= 26 tokens: 32 columns
    engine.generate_batch([prompts[4] * 4], greedy(40))  # 1 row of 4 x 14 + 40 tokens -> 128 columns
    assert engine.stats()["kv_cache_columns"] == 128 and engine.stats()["parked_rows"] == 4
    fillers = [tok.encode(f"zz{i}") for i in range(9)]
    engine.generate_batch(fillers, greedy(3))  # 9 rows > 8
    assert engine.stats()["kv_cache_rows"] == 16 and engine.stats()["evicted"] == 0
    second = [p + o.token_ids + tok.encode(OBS[i]) for i, (p, o) in enumerate(zip(prompts[:3], first))]
    outs = engine.generate_batch(second, greedy(6))
    assert engine.stats()["prefix_hits"] == 3
    assert engine.stats()["prefix_reused_tokens"] == sum(len(p) + 5 for p in prompts[:3])
    ref = HFRolloutEngine(model, tok, enable_prefix_caching=False).generate_batch(second, greedy(6))
    assert_same([outs], [ref])


def test_prompts_of_unlike_lengths_prefill_in_separate_forwards_with_the_same_result(model_and_tokenizer, prompts):
    """Grouping by length (less padding) changes how many forwards run, not what comes out."""
    model, tok = model_and_tokenizer
    mixed = [p * k for p, k in zip(prompts[:4], (1, 2, 4, 8))]  # lengths far apart
    grouped = HFRolloutEngine(model, tok, enable_prefix_caching=False)
    outs = grouped.generate_batch(mixed, greedy(6))
    assert grouped.stats()["prefill_forwards"] > 1
    assert grouped.stats()["prefill_tokens"] == sum(len(p) for p in mixed)  # every prompt token, once
    ref = [HFRolloutEngine(model, tok, enable_prefix_caching=False).generate_batch([p], greedy(6))[0] for p in mixed]
    assert_same([outs], [ref])
