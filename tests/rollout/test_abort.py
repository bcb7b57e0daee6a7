"""abort_all (partial rollouts at a weight sync) and the multi_modal_data keyword on a text model."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine


@pytest.fixture(scope="module")
def prompts(model_and_tokenizer, prompt_texts):
    _, tok = model_and_tokenizer
    return [tok.encode(t) for t in prompt_texts]


def long_greedy(m=200):
    return SamplingParams(do_sample=False, max_tokens=m, ignore_eos=True, logprobs=True)


def test_abort_all_returns_partial_outputs_of_running_and_waiting_requests(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok, max_num_seqs=4)
    full = HFRolloutEngine(model, tok).generate_batch(prompts, long_greedy())

    async def run():
        tasks = [asyncio.ensure_future(engine.generate(p, long_greedy(), f"r{i}")) for i, p in enumerate(prompts)]
        while engine.stats()["decode_steps"] < 5:
            await asyncio.sleep(0.005)
        aborted = engine.abort_all()
        return aborted, await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    aborted, outs = asyncio.run(run())
    assert aborted == 6 and all(o.finish_reason == "abort" for o in outs)
    running = [o for o in outs if o.token_ids]
    assert len(running) == 4  # max_num_seqs rows were decoding; the 2 waiting ones return empty
    for o, ref in zip(outs, full):
        n = len(o.token_ids)
        assert n < 200 and o.token_ids == ref.token_ids[:n] and len(o.log_probs) == n
        assert torch.allclose(torch.tensor(o.log_probs), torch.tensor(ref.log_probs[:n]), atol=1e-5)
    assert engine.stats()["aborted"] == 6
    # usable afterwards, and a partial rollout continues from its prefix (reusing the parked row)
    o = running[0]
    i = int(o.request_id[1:])
    rest = engine.generate_batch([prompts[i] + o.token_ids], long_greedy(200 - len(o.token_ids)))[0]
    assert rest.finish_reason == "length" and o.token_ids + rest.token_ids == full[i].token_ids
    assert engine.stats()["prefix_hits"] == 1


def test_abort_all_from_another_thread_ends_generate_batch(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    outs = []
    worker = threading.Thread(target=lambda: outs.extend(engine.generate_batch(prompts, long_greedy(2000 - 80))))
    worker.start()
    while engine.stats()["decode_steps"] < 3:
        worker.join(0.005)
    assert engine.abort_all() == 6
    worker.join(30)
    assert not worker.is_alive()
    assert [o.finish_reason for o in outs] == ["abort"] * 6 and all(0 < len(o.token_ids) < 1920 for o in outs)
    assert engine.abort_all() == 0  # nothing in flight: a no-op


def test_images_are_refused_by_a_text_model(model_and_tokenizer, prompts):
    model, tok = model_and_tokenizer
    engine = HFRolloutEngine(model, tok)
    params = SamplingParams(do_sample=False, max_tokens=3)

    async def run(mm):
        return await engine.generate(prompts[0], params, "r", multi_modal_data=mm)

    with pytest.raises(ValueError, match="1 image.*text-only.*Qwen2-VL.*or drop the images"):
        asyncio.run(run({"image": [object()]}))
    assert len(asyncio.run(run({})).token_ids) == 3  # nothing to show: fine
    assert len(asyncio.run(run({"image": []})).token_ids) == 3
