"""The generation watchdog (``actor_rollout_ref.rollout.stall_timeout_s``): a replica holding work without
progress fails it by name; a slow replica that still makes progress is left alone.

The engine is made artificially slow by patching the batcher's decode step (a sleep), and the watchdog's limit
is a fraction of a second."""

from __future__ import annotations

import time

import pytest

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.base import EngineError
from hybridflow.rollout.hf.batcher import ContinuousBatcher
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.service.interruptible_server import InterruptibleRolloutServer
from hybridflow.rollout.service.server import GenerateRequest, RolloutServer
from hybridflow.rollout.service.server_watch import ServerWatch, parse_metrics
from hybridflow.rollout.service.watchdog import GenerationStalled, StallWatchdog

LIMIT_S = 0.6


def _slow_decode(monkeypatch, seconds: float, from_call: int = 1, only_once: bool = False):
    real = ContinuousBatcher._decode
    calls = [0]

    def decode(self):
        calls[0] += 1
        if calls[0] >= from_call and (not only_once or calls[0] == from_call):
            time.sleep(seconds)
        return real(self)

    monkeypatch.setattr(ContinuousBatcher, "_decode", decode)


def _requests(tok, n=4, max_tokens=8):
    return [GenerateRequest(f"r{i}", tok.encode(f"{i}+{i}="), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for i in range(n)]


@pytest.fixture()
def engine(model_and_tokenizer):
    model, tok = model_and_tokenizer
    return HFRolloutEngine(model, tok, name="slow")


def test_a_stuck_decode_fails_every_request_naming_the_replica_the_count_and_the_phase(
        engine, model_and_tokenizer, monkeypatch):
    _, tok = model_and_tokenizer
    _slow_decode(monkeypatch, 4.0, from_call=2, only_once=True)
    server = RolloutServer(engine, name="replica-3", stall_timeout_s=LIMIT_S)
    try:
        start = time.monotonic()
        futures = server.submit_many(_requests(tok))
        errors = [f.exception(timeout=30) for f in futures]
        waited = time.monotonic() - start
        assert waited < 3.0, waited  # not the 4 s the decode is stuck for
        error = errors[0]
        assert all(e is error for e in errors) and isinstance(error, GenerationStalled)
        assert isinstance(error, EngineError)  # so a run stops on it
        text = str(error)
        assert "rollout replica 'replica-3' made no progress" in text
        assert "4 request(s) in flight" in text and "doing: decode" in text
        assert "actor_rollout_ref.rollout.stall_timeout_s=0.6" in text
        assert "thread 'hf-rollout" in text and "in decode" in text  # the stuck thread's stack
        # the server refuses new work at once with the same error (the engine is stuck)
        assert server.submit_many(_requests(tok, 1))[0].exception(timeout=1) is error
        with pytest.raises(GenerationStalled):
            server.call(lambda: None, what="sleep")
    finally:
        server.close()


def test_a_slow_engine_that_makes_progress_is_not_stalled(engine, model_and_tokenizer, monkeypatch):
    _, tok = model_and_tokenizer
    _slow_decode(monkeypatch, LIMIT_S / 3)  # every decode step takes a third of the limit: 8 tokens take > 1.6 s
    server = RolloutServer(engine, name="replica-4", stall_timeout_s=LIMIT_S)
    try:
        start = time.monotonic()
        outs = [f.result(timeout=60) for f in server.submit_many(_requests(tok))]
        assert time.monotonic() - start > 2 * LIMIT_S  # longer than the limit in total
        assert [len(o.token_ids) for o in outs] == [8] * 4 and server.failed is None
    finally:
        server.close()


def test_a_weight_load_that_never_returns_is_named(engine):
    server = RolloutServer(engine, name="replica-5", stall_timeout_s=LIMIT_S)
    try:
        start = time.monotonic()
        with pytest.raises(GenerationStalled, match=r"a 'weights' call under way"):
            server.call(lambda: time.sleep(5), what="weights")
        assert time.monotonic() - start < 3.0
    finally:
        server.close()


def test_requests_held_at_an_interrupted_server_are_not_stalled(engine, model_and_tokenizer):
    """A partial-rollout server holds requests at its gate during a weight sync: no progress is expected."""
    _, tok = model_and_tokenizer
    server = InterruptibleRolloutServer(engine, name="replica-6", stall_timeout_s=LIMIT_S)
    try:
        server.interrupt()
        futures = server.submit_many(_requests(tok, 2))
        time.sleep(4 * LIMIT_S)
        assert server.failed is None and not any(f.done() for f in futures)
        server.resume()
        assert [len(f.result(timeout=30).token_ids) for f in futures] == [8, 8]
    finally:
        server.close()


def test_the_watchdog_can_be_turned_off(engine, model_and_tokenizer, monkeypatch):
    _, tok = model_and_tokenizer
    _slow_decode(monkeypatch, 1.5, from_call=2, only_once=True)
    server = RolloutServer(engine, name="replica-7", stall_timeout_s=0)
    try:
        assert [len(f.result(timeout=30).token_ids) for f in server.submit_many(_requests(tok, 2))] == [8, 8]
        assert server.watchdog._thread is None
    finally:
        server.close()


def test_watchdog_decisions_step_by_step():
    """The watchdog's rule on a fake clock: busy + unchanged signature for the limit -> error; progress,
    idleness or a pause restart the count."""
    state = {"inflight": 2, "calls": [], "finished": 0, "paused": False, "counter": 0}
    dog = StallWatchdog("r", 10.0, lambda: (state["inflight"], state["calls"], state["finished"], state["paused"]),
                        lambda: (state["counter"], "decode"), on_stall=lambda e: None)
    assert dog.check(0.0) is None
    assert dog.check(9.0) is None
    state["counter"] = 1  # a forward finished
    assert dog.check(15.0) is None and dog.check(24.0) is None
    assert isinstance(dog.check(25.5), GenerationStalled)
    state["paused"] = True
    assert dog.check(100.0) is None  # held back on purpose
    state["paused"], state["inflight"], state["calls"] = False, 0, ["weights"]
    assert dog.check(101.0) is None and "a 'weights' call under way" in str(dog.check(112.0))
    state["calls"] = []
    assert dog.check(200.0) is None  # idle


def test_metrics_parsing_sums_label_sets():
    text = ('# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            'vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 5.5e+02\n')
    m = parse_metrics(text)
    assert m == {"vllm:num_requests_running": 4.0, "vllm:generation_tokens_total": 1234.0,
                 "vllm:prompt_tokens_total": 550.0}


class _FakeServer:
    def __init__(self, name):
        self.name, self.url, self.stopped = name, f"http://{name}", False

    def alive(self):
        return not self.stopped

    def stop(self):
        self.stopped = True


def test_server_watch_stops_a_server_whose_tokens_stand_still():
    a, b = _FakeServer("vllm-server-0"), _FakeServer("vllm-server-1")
    metrics = {a.url: {"vllm:num_requests_running": 2.0, "vllm:generation_tokens_total": 10.0},
               b.url: {"vllm:num_requests_running": 2.0, "vllm:generation_tokens_total": 10.0}}
    watch = ServerWatch([a, b], 30.0, read=lambda url: dict(metrics[url]))
    watch.check(0.0)
    metrics[b.url]["vllm:generation_tokens_total"] = 11.0  # b keeps generating
    watch.check(20.0)
    metrics[b.url]["vllm:generation_tokens_total"] = 12.0
    watch.check(31.0)
    assert a.stopped and not b.stopped
    assert "replica 'vllm-server-0'" in str(watch.stalled["vllm-server-0"])
    assert "2 request(s) running" in str(watch.stalled["vllm-server-0"])
    assert "vllm-server-1" not in watch.stalled
    metrics[b.url]["vllm:num_requests_running"] = 0.0  # idle: never stalled
    watch.check(100.0)
    watch.check(200.0)
    assert not b.stopped


def test_a_stuck_decode_fails_requests_served_on_the_servers_own_loop(engine, model_and_tokenizer, monkeypatch):
    """The local backend's agent loops run on the server's loop (``RolloutServer.run``) and reach the engine with
    ``serve``: a stalled engine fails them with the watchdog's error too, and the ``run`` waiting on them raises
    it at once."""
    import asyncio

    from hybridflow.rollout.service.replica import InProcessReplica

    _, tok = model_and_tokenizer
    _slow_decode(monkeypatch, 4.0, from_call=2, only_once=True)
    server = RolloutServer(engine, name="replica-6", stall_timeout_s=LIMIT_S)
    replica = InProcessReplica(server)
    try:
        seen = []

        async def one(r):
            try:
                return await replica.generate(r.request_id, r.prompt_ids, r.sampling_params)
            except BaseException as exc:
                seen.append(exc)
                raise

        async def trajectories():
            return await asyncio.gather(*(one(r) for r in _requests(tok)))

        start = time.monotonic()
        with pytest.raises(GenerationStalled) as raised:
            server.run(trajectories())
        assert time.monotonic() - start < 3.0
        assert "rollout replica 'replica-6' made no progress" in str(raised.value)
        assert "4 request(s) in flight" in str(raised.value)
        deadline = time.monotonic() + 2.0
        while len(seen) < 4 and time.monotonic() < deadline:  # handed to them on the loop's thread
            time.sleep(0.01)
        assert len(seen) == 4 and all(e is raised.value for e in seen), seen  # no request is left waiting
    finally:
        server.close()


def test_a_loop_blocked_by_user_code_fails_the_run_waiting_on_it(engine, model_and_tokenizer, monkeypatch):
    """A coroutine that blocks the server's loop (user code calling ``time.sleep`` in an agent loop) while a request
    is in flight stops the engine's driver: the watchdog fails the waiting ``run`` instead of leaving it hung."""
    import asyncio

    from hybridflow.rollout.service.replica import InProcessReplica

    _, tok = model_and_tokenizer
    _slow_decode(monkeypatch, 0.02)  # 64 tokens take > 1 s: the request is still in flight when the loop blocks
    server = RolloutServer(engine, name="replica-7", stall_timeout_s=LIMIT_S)
    replica = InProcessReplica(server)
    request = _requests(tok, 1, max_tokens=64)[0]
    try:
        async def blocking():
            task = asyncio.ensure_future(replica.generate(request.request_id, request.prompt_ids,
                                                          request.sampling_params))
            await asyncio.sleep(0.05)  # in the engine, driver started
            time.sleep(5)  # the loop's thread is stuck here
            return await task

        start = time.monotonic()
        with pytest.raises(GenerationStalled, match="replica-7"):
            server.run(blocking())
        assert time.monotonic() - start < 4.5
    finally:
        server.close()
