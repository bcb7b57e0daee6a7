"""A generative reward model on the rollout service: the router's OpenAI API over real hf replicas, its limits
(concurrency, requests and tokens per minute, timeout), the client reward functions use, and how the reward
managers count a judge that times out or answers something unreadable."""

from __future__ import annotations

import asyncio
import pickle
import time

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.rewards.judge import (
    JudgeClient,
    JudgeParseError,
    JudgeTimeout,
    LazyTokenizer,
    chat_complete,
    parse_score,
)
from hybridflow.rollout import SamplingParams, create_rollout_engine
from hybridflow.rollout.service.judge_router import JudgeLimits, JudgeRouter, TokenBucket
from hybridflow.rollout.service.replica import InProcessReplica
from hybridflow.rollout.service.server import RolloutServer

JUDGE_FNS = __file__.replace("tests/rewards/test_judge.py", "tests/integration/judge_fns.py")


class CountingReplica(InProcessReplica):
    """A real in-process replica that also records how many requests were in flight at once."""

    def __init__(self, server):
        super().__init__(server)
        self.in_flight = 0
        self.peak = 0

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None):
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            return await super().generate(request_id, prompt_ids, sampling_params, multi_modal_data)
        finally:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def judge(nano_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(nano_model_dir)
    model = AutoModelForCausalLM.from_pretrained(nano_model_dir).eval()
    engine = create_rollout_engine("hf", model=model, tokenizer=tok, seed=0, max_num_seqs=64)
    server = RolloutServer(engine, name="judge-test")
    yield engine, server, tok
    server.close()


def make_router(judge, **limits):
    engine, server, tok = judge
    replica = CountingReplica(server)
    router = JudgeRouter([replica], tok, JudgeLimits(**{"response_length": 8, "prompt_length": 64, **limits}),
                         defaults={"temperature": 0.0})
    return router, replica


def test_chat_completions_are_the_engine_greedy_answer(judge):
    engine, _, tok = judge
    router, _ = make_router(judge)
    try:
        messages = [{"role": "user", "content": "12+34="}]
        answer = asyncio.run(chat_complete(router.address, {"messages": messages, "max_tokens": 5}))
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        direct = engine.generate_batch([list(ids)], SamplingParams(do_sample=False, max_tokens=5))[0]
        tokens = [t for t in direct.token_ids if t != tok.eos_token_id]
        assert answer["choices"][0]["message"]["content"] == tok.decode(tokens, skip_special_tokens=True)
        assert answer["usage"]["prompt_tokens"] == len(ids)
        text = asyncio.run(JudgeClient(router.address).complete("12+34=", max_tokens=3))
        assert isinstance(text, str)
        stats = router.take_metrics()
        assert stats["judge/requests"] == 2 and stats["judge/completed"] == 2 and stats["judge/timeouts"] == 0
        assert router.take_metrics()["judge/requests"] == 0  # counters are per step
    finally:
        router.close()


async def _gather(address):
    client = JudgeClient(address)
    return await asyncio.gather(*(client.chat([{"role": "user", "content": f"{i}+{i}="}], max_tokens=8)
                                  for i in range(12)))


def test_concurrency_limit_holds(judge):
    router, replica = make_router(judge, max_concurrent=2)
    try:
        assert len(asyncio.run(_gather(router.address))) == 12
        assert replica.peak == 2
    finally:
        router.close()
    unlimited, replica = make_router(judge, max_concurrent=0)
    try:
        asyncio.run(_gather(unlimited.address))
        assert replica.peak > 2
    finally:
        unlimited.close()


def test_requests_per_minute_limit_spaces_the_requests(judge):
    router, _ = make_router(judge, max_rpm=240)  # 4 per second, at most 4 at once from a full bucket
    try:
        start = time.monotonic()
        asyncio.run(_gather(router.address))  # 12 requests: 4 at once, then 8 more at 4/s
        assert time.monotonic() - start >= 1.8
        assert router.take_metrics()["judge/wait_s"] > 0
    finally:
        router.close()


def test_token_bucket():
    async def run():
        bucket = TokenBucket(rate=100.0, capacity=10.0)
        start = time.monotonic()
        await bucket.take(10.0)  # the full bucket: no wait
        first = time.monotonic() - start
        await bucket.take(10.0)  # empty: 10 tokens at 100/s
        return first, time.monotonic() - start

    first, total = asyncio.run(run())
    assert first < 0.05 and 0.08 <= total < 0.5
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_timeouts_and_long_prompts_are_refused_and_counted(judge):
    router, _ = make_router(judge, request_timeout_s=0.001, response_length=64)
    try:
        with pytest.raises(JudgeTimeout, match="request_timeout_s"):
            asyncio.run(JudgeClient(router.address).chat([{"role": "user", "content": "1+1="}], max_tokens=64))
        assert router.take_metrics()["judge/timeouts"] == 1
    finally:
        router.close()
    router, _ = make_router(judge, prompt_length=4)
    try:
        with pytest.raises(Exception, match="prompt_length=4"):
            asyncio.run(JudgeClient(router.address).chat([{"role": "user", "content": "123456789+987654321="}]))
        assert router.take_metrics()["judge/rejected"] == 1
    finally:
        router.close()


def test_parse_score_and_the_picklable_helpers(nano_model_dir):
    assert parse_score("score: 7", scale=10.0) == 0.7
    assert parse_score("0521", r"^\d{3}([01])") == 1.0
    with pytest.raises(JudgeParseError, match="no score"):
        parse_score("no number here")
    client = pickle.loads(pickle.dumps(JudgeClient("127.0.0.1:1", 3.0)))
    assert client.address == "127.0.0.1:1" and client.timeout_s == 3.0
    tok = pickle.loads(pickle.dumps(LazyTokenizer(nano_model_dir)))
    assert tok.encode("12", add_special_tokens=False)  # loads on first use


def _scored_batch(tok, answers):
    prompts = torch.tensor([tok.encode("1+1=", add_special_tokens=False)] * len(answers))
    responses = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(tok.encode(a, add_special_tokens=False)) for a in answers], batch_first=True,
        padding_value=tok.pad_token_id)
    attention = torch.cat([torch.ones_like(prompts), (responses != tok.pad_token_id).long()], dim=1)
    return DataProto.from_dict(
        {"prompts": prompts, "responses": responses, "attention_mask": attention,
         "response_mask": attention[:, prompts.shape[1]:]},
        {"data_source": np.array(["t"] * len(answers), dtype=object),
         "reward_model": np.array([{"ground_truth": "2"}] * len(answers), dtype=object),
         "extra_info": np.array([{"question": "1+1="}] * len(answers), dtype=object)})


@pytest.mark.parametrize("workers", [0, 1])
def test_reward_managers_count_judge_failures(judge, workers):
    """A judge that times out and one whose answers hold no number: every sample scores error_score, and the
    counts say which."""
    from hybridflow.rewards.custom_function import ScoreFnSpec
    from hybridflow.rewards.managers import NaiveRewardManager
    from hybridflow.rewards.outcome import ScoringConfig

    _, _, tok = judge
    batch = _scored_batch(tok, ["2", "3", "22"])
    for limits, fn, key in (({"request_timeout_s": 0.001, "response_length": 64}, "ask_judge", "judge_timeout_count"),
                            ({}, "ask_and_parse", None)):
        router, _ = make_router(judge, **limits)
        try:
            offered = {"judge": JudgeClient(router.address, router.limits.request_timeout_s),
                       "reward_router_address": router.address}
            manager = NaiveRewardManager(tok, compute_score=ScoreFnSpec(path=JUDGE_FNS, name=fn),
                                         scoring=ScoringConfig(num_workers=workers, timeout_s=60, error_score=-1.0),
                                         offered_kwargs=offered)
            try:
                out = manager(batch, return_dict=True)
            finally:
                manager.close()
        finally:
            router.close()
        metrics = out["reward_metrics"]
        if key is not None:  # every request timed out
            assert metrics["reward/judge_timeout_count"] == 3 and metrics["reward/error_count"] == 3
            assert out["reward_tensor"].sum().item() == -3.0
            assert "JudgeTimeout" in out["reward_errors"][0]
        else:  # the random judge mostly writes no digit: those are unparsable, counted apart, scored -1
            unparsable = metrics["reward/judge_unparsable_count"]
            assert unparsable == metrics["reward/error_count"] and metrics["reward/judge_timeout_count"] == 0
            failed = [e for e in out["reward_errors"] if e is not None]
            assert len(failed) == unparsable and all("JudgeParseError" in e for e in failed)


def test_a_function_that_takes_no_judge_keyword_is_refused(judge):
    from hybridflow.launch.config import load_config
    from hybridflow.rewards import load_reward_manager

    _, _, tok = judge
    cfg = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=1",
                       "critic.ppo_micro_batch_size_per_gpu=4", "reward_model.enable=true",
                       "reward_model.rollout.name=hf", f"custom_reward_function.path={JUDGE_FNS}",
                       "custom_reward_function.name=no_judge"])
    with pytest.raises(ValueError, match="takes none of"):
        load_reward_manager(cfg, tok, judge_kwargs={"judge": JudgeClient("x:1"), "reward_router_address": "x:1"})
