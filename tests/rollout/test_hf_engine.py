"""The hf engine at the token level: agreement with transformers, log-probs, seeds, EOS, batching, hooks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hybridflow.rollout import ROLLOUT_ENGINES, SamplingParams, create_rollout_engine
from hybridflow.rollout.hf.engine import HFRolloutEngine


@pytest.fixture(scope="module")
def prompts(model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    return [tok.encode(t) for t in prompt_texts]


def hf_greedy(model, tok, prompt, max_new):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return out[0, len(prompt):].tolist()


def test_greedy_equals_transformers_generate(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    outs = engine.generate_batch(prompts, SamplingParams(do_sample=False, max_tokens=16))
    for prompt, out in zip(prompts, outs):
        ref = hf_greedy(model, tok, prompt, 16)
        if ref and ref[-1] == tok.eos_token_id:
            assert out.finish_reason == "stop"
        assert out.token_ids == ref
    assert len({tuple(o.token_ids) for o in outs}) == len(outs)  # the model does give varied outputs


def test_log_probs_match_full_forward_recomputation(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, seed=3)
    temperature = 0.7
    outs = engine.generate_batch(prompts, SamplingParams(temperature=temperature, top_p=0.9, max_tokens=12, logprobs=True))
    diffs = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outs):
            seq = torch.tensor([prompt + out.token_ids])
            logits = model(seq).logits[0, len(prompt) - 1 : -1] / temperature
            ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
            diffs.append((ref - torch.tensor(out.log_probs)).abs())
    diffs = torch.cat(diffs)
    assert diffs.mean().item() < 1e-5 and diffs.max().item() < 1e-4


def test_seeded_sampling_is_deterministic(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    params = SamplingParams(temperature=1.0, max_tokens=10)
    a = HFRolloutEngine(model, tok, seed=11).generate_batch(prompts, params)
    b = HFRolloutEngine(model, tok, seed=11).generate_batch(prompts, params)
    engine = HFRolloutEngine(model, tok, seed=12)
    c = engine.generate_batch(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.token_ids for o in a] != [o.token_ids for o in c]
    engine.reseed(11)
    assert [o.token_ids for o in engine.generate_batch(prompts, params)] == [o.token_ids for o in a]


def test_stop_token_ends_the_response(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    free = engine.generate_batch(prompts[:1], SamplingParams(do_sample=False, max_tokens=16, ignore_eos=True))[0]
    stop = free.token_ids[4]
    first = free.token_ids.index(stop)
    out = engine.generate_batch(prompts[:1], SamplingParams(do_sample=False, max_tokens=16, stop_token_ids=(stop,)))[0]
    assert out.token_ids == free.token_ids[: first + 1] and out.finish_reason == "stop"
    ignored = engine.generate_batch(
        prompts[:1], SamplingParams(do_sample=False, max_tokens=16, stop_token_ids=(stop,), ignore_eos=True))[0]
    assert ignored.token_ids == free.token_ids and ignored.finish_reason == "length"


def test_continuous_batching_with_small_batch_matches_one_big_batch(model_and_tokenizer, prompts):
    """Six requests through two rows: finished rows leave, waiting requests join mid-flight."""
    model, tok = model_and_tokenizer
    params = [SamplingParams(do_sample=False, max_tokens=m, ignore_eos=True) for m in (3, 9, 5, 12, 2, 7)]
    big = HFRolloutEngine(model, tok, max_batch_size=64).generate_batch(prompts, params)
    small = HFRolloutEngine(model, tok, max_batch_size=2).generate_batch(prompts, params)
    assert [o.token_ids for o in small] == [o.token_ids for o in big]
    assert [len(o.token_ids) for o in small] == [3, 9, 5, 12, 2, 7]


def test_async_concurrent_requests_equal_batch_results(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    params = SamplingParams(temperature=1.0, max_tokens=10, logprobs=True)
    batch = HFRolloutEngine(model, tok, seed=5).generate_batch(prompts, params)
    engine = HFRolloutEngine(model, tok, seed=5)

    async def run():
        return await asyncio.gather(*(engine.generate(p, params, f"r{i}") for i, p in enumerate(prompts)))

    concurrent = asyncio.run(run())
    assert [o.request_id for o in concurrent] == [f"r{i}" for i in range(len(prompts))]
    assert [o.token_ids for o in concurrent] == [o.token_ids for o in batch]
    for got, want in zip(concurrent, batch):
        assert got.log_probs == pytest.approx(want.log_probs, abs=1e-6)

    async def staggered():  # late arrivals join the running batch; greedy results are batch-invariant
        greedy = SamplingParams(do_sample=False, max_tokens=8)
        first = asyncio.ensure_future(engine.generate(prompts[0], greedy, "a"))
        await asyncio.sleep(0.05)
        second = await engine.generate(prompts[1], greedy, "b")
        return await first, second

    a, b = asyncio.run(staggered())
    ref = HFRolloutEngine(model, tok).generate_batch(prompts[:2], SamplingParams(do_sample=False, max_tokens=8))
    assert (a.token_ids, b.token_ids) == (ref[0].token_ids, ref[1].token_ids)


def test_each_step_wakes_the_waiting_loop_once(model_and_tokenizer, prompts, monkeypatch):
    """The requests a step finishes and the step's own end reach the event loop in one wake-up (one
    ``call_soon_threadsafe``), not one per finished request plus one for the step."""
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, seed=5)
    steps = []
    real_step = HFRolloutEngine._step_and_report
    monkeypatch.setattr(HFRolloutEngine, "_step_and_report", lambda self, *a: (steps.append(1), real_step(self, *a)))
    params = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
    prompts = prompts * 4

    async def run():
        loop = asyncio.get_running_loop()
        wakeups = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a, **k: (wakeups.append(1), real(*a, **k))[1]
        outs = await asyncio.gather(*(engine.generate(p, params, f"r{i}") for i, p in enumerate(prompts)))
        return outs, len(wakeups)

    outs, wakeups = asyncio.run(run())
    assert [len(o.token_ids) for o in outs] == [5] * len(prompts)
    assert len(steps) >= 2 and wakeups == len(steps), (wakeups, len(steps))


def test_bad_requests_are_explained(model_and_tokenizer):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        engine.generate_batch([[]], SamplingParams())
    with pytest.raises(ValueError, match="n=1"):
        engine.generate_batch([[5, 6]], SamplingParams(n=2))


def test_update_weights_sleep_wake_and_training_mode(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    greedy = SamplingParams(do_sample=False, max_tokens=6, ignore_eos=True)
    before = engine.generate_batch(prompts[:2], greedy)
    assert engine.update_weights(model.named_parameters()) == 0  # colocated: same storage, nothing copied
    with pytest.raises(KeyError, match="did you mean"):
        engine.update_weights([("model.norm.weigth", torch.zeros(3))])

    import copy
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.0)
    twin = HFRolloutEngine(copy.deepcopy(model), tok)
    assert twin.update_weights(other.named_parameters()) == len(list(other.parameters()))
    assert [o.token_ids for o in twin.generate_batch(prompts[:2], greedy)] != [o.token_ids for o in before]

    assert engine.kv_cache_bytes > 0
    engine.sleep()
    assert engine.kv_cache_bytes == 0
    with pytest.raises(RuntimeError, match="wake_up"):
        engine.generate_batch(prompts[:1], greedy)
    engine.wake_up()
    model.train()
    try:
        assert [o.token_ids for o in engine.generate_batch(prompts[:2], greedy)] == [o.token_ids for o in before]
        assert model.training  # the actor's mode is restored after generation
    finally:
        model.eval()


def test_registry(model_and_tokenizer):
    import importlib.util

    model, tok = model_and_tokenizer
    assert {"hf", "vllm", "sglang"} <= set(ROLLOUT_ENGINES.names())
    assert isinstance(create_rollout_engine("hf", model=model, tokenizer=tok), HFRolloutEngine)
    with pytest.raises(KeyError, match="Did you mean 'vllm'"):
        create_rollout_engine("vlm")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match=r"pip install hybridflow\[vllm\]"):
            create_rollout_engine("vllm")


def test_flash_attention_models_are_rejected(model_and_tokenizer):
    model, tok = model_and_tokenizer
    previous = model.config._attn_implementation
    model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="attn_implementation"):
            HFRolloutEngine(model, tok)
    finally:
        model.config._attn_implementation = previous


def test_cache_grows_while_rows_are_live(model_and_tokenizer, prompts):
    """A long request joining a running batch reallocates the KV cache without disturbing live rows."""
    model, tok = model_and_tokenizer
    params = [SamplingParams(do_sample=False, max_tokens=m, ignore_eos=True) for m in (3, 40, 90)]
    engine = HFRolloutEngine(model, tok, max_batch_size=2)
    small = engine.generate_batch(prompts[:3], params)
    assert engine._batcher.cache.capacity >= len(prompts[2]) + 90 > 64
    big = HFRolloutEngine(model, tok).generate_batch(prompts[:3], params)
    assert [o.token_ids for o in small] == [o.token_ids for o in big]


def test_repeated_prompts_share_one_prefill_and_match_separate_prefills(model_and_tokenizer, prompts):
    """rollout.n copies of a prompt are prefilled once; every row still samples on its own and the
    result equals prefilling each copy (one engine per row as the reference)."""
    model, tok = model_and_tokenizer
    grouped = [p for p in prompts[:3] for _ in range(4)]
    calls = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        greedy = SamplingParams(do_sample=False, max_tokens=6, logprobs=True)
        engine = HFRolloutEngine(model, tok)
        shared = engine.generate_batch(grouped, greedy)
    finally:
        hook.remove()
    prefills = engine.stats()["prefill_forwards"]  # prompts of unlike lengths go in separate forwards
    assert sum(calls[:prefills]) == 3  # the prefill forwards saw the 3 distinct prompts, not 12 rows
    assert all(c == 12 for c in calls[prefills:])  # every decode step covers all 12 rows
    alone = [HFRolloutEngine(model, tok).generate_batch([p], greedy)[0] for p in grouped]
    assert [o.token_ids for o in shared] == [o.token_ids for o in alone]
    for a, b in zip(shared, alone):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5)
    sampled = HFRolloutEngine(model, tok, seed=3).generate_batch(grouped, SamplingParams(temperature=1.0, max_tokens=8))
    assert len({tuple(o.token_ids) for o in sampled}) > 3  # copies of one prompt still diverge


def test_a_failing_prefill_reaches_the_waiting_request_instead_of_hanging(model_and_tokenizer, prompts):
    """Requests taken from the queue for a prefill that raises are not rows yet: they must still get the error."""
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)

    def broken(*args, **kwargs):
        raise RuntimeError("prefill exploded")

    hook = model.register_forward_pre_hook(lambda m, a, kw: broken(), with_kwargs=True)

    async def ask():
        return await asyncio.wait_for(engine.generate(prompts[0], SamplingParams(max_tokens=3), "r0"), timeout=20)

    try:
        with pytest.raises(RuntimeError, match="prefill exploded"):
            asyncio.run(ask())
    finally:
        hook.remove()
    out = engine.generate_batch(prompts[:1], SamplingParams(do_sample=False, max_tokens=3))  # still usable
    assert len(out[0].token_ids) == 3


def test_stop_and_pad_ids_come_from_the_arguments_then_the_tokenizer_then_the_model():
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer()
    model = build_tiny_model(tok, size="nano", eos_token_id=5, pad_token_id=None)  # the model names other ids
    model.generation_config.eos_token_id = [5, 6]
    assert (HFRolloutEngine(model, tok).eos_token_ids, HFRolloutEngine(model, tok)._batcher.pad_token_id) == (
        (tok.eos_token_id,), tok.pad_token_id)
    assert HFRolloutEngine(model, tok, eos_token_ids=[7, 8], pad_token_id=9).eos_token_ids == (7, 8)
    assert HFRolloutEngine(model, tok, eos_token_ids=[7, 8], pad_token_id=9)._batcher.pad_token_id == 9
    bare = HFRolloutEngine(model)  # no tokenizer: the generation config's EOS ids, pad 0 (the model names none)
    assert (bare.eos_token_ids, bare._batcher.pad_token_id) == ((5, 6), 0)
