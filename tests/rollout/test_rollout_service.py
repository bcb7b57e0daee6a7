"""The rollout service: a server hosting an engine on its own loop, replicas, and the server manager's routing."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from hybridflow.rollout import SamplingParams, create_rollout_engine
from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.service.replica import InProcessReplica, RolloutReplica
from hybridflow.rollout.service.server import GenerateRequest, RolloutServer
from hybridflow.rollout.service.server_manager import AsyncLLMServerManager, derive_seed


RAY_CPUS = 1  # the shared ray_cluster fixture (conftest.py)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa").eval()
    return create_rollout_engine("hf", model=model, tokenizer=tok, seed=0), tok


GREEDY = SamplingParams(do_sample=False, max_tokens=6, ignore_eos=True)


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_server_answers_requests_from_other_threads_in_input_order(engine):
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    try:
        prompts = [_ids(tok, t) for t in ("1+2=", "33+4=", "5+66=", "7+8=")]
        expected = eng.generate_batch(prompts, GREEDY)
        results: dict[int, TokenOutput] = {}

        def client(i):
            results[i] = server.submit(GenerateRequest(f"r{i}", prompts[i], GREEDY)).result(timeout=60)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [results[i].token_ids for i in range(4)] == [e.token_ids for e in expected]
        assert all(results[i].request_id == f"r{i}" for i in range(4))
    finally:
        server.close()


def test_stream_yields_every_request_once_and_isolates_a_failing_one(engine):
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    try:
        requests = [GenerateRequest("a", _ids(tok, "1+1="), GREEDY), GenerateRequest("bad", [], GREEDY),
                    GenerateRequest("c", _ids(tok, "2+2="), GREEDY)]
        seen = {}
        for group in server.stream(requests):
            for index, out in group:
                assert index not in seen
                seen[index] = out
        assert sorted(seen) == [0, 1, 2]
        assert isinstance(seen[1], ValueError) and "empty" in str(seen[1])
        assert len(seen[0].token_ids) == 6 and len(seen[2].token_ids) == 6
    finally:
        server.close()


class _Recorder(RolloutReplica):
    """A replica that records what it was asked and answers after ``delay`` seconds."""

    def __init__(self, name, delay=0.0):
        self.name, self.delay, self.calls = name, delay, []

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None):
        self.calls.append((request_id, sampling_params))
        await asyncio.sleep(self.delay)
        return TokenOutput(request_id, [1, 2], None, "stop")


def test_server_manager_is_sticky_per_request_and_balances_new_ones():
    slow, fast = _Recorder("slow", delay=0.05), _Recorder("fast")
    manager = AsyncLLMServerManager([slow, fast], default_max_tokens=8)

    async def scenario():
        # a long request occupies replica 0; new trajectories go to the idle replica 1
        first = asyncio.create_task(manager.generate("t0", prompt_ids=[1], sampling_params={}))
        await asyncio.sleep(0)
        await manager.generate("t1", prompt_ids=[1], sampling_params={})
        await manager.generate("t1", prompt_ids=[1, 2, 3], sampling_params={})  # second turn: same replica
        await first
        await manager.generate("t0", prompt_ids=[1, 5], sampling_params={})  # t0's second turn: back to replica 0

    asyncio.run(scenario())
    assert [c[0] for c in slow.calls] == ["t0/0", "t0/1"]
    assert [c[0] for c in fast.calls] == ["t1/0", "t1/1"]
    assert manager.outstanding == [0, 0]


def test_server_manager_converts_verl_sampling_dicts_and_derives_per_turn_seeds():
    rep = _Recorder("r")
    manager = AsyncLLMServerManager([rep], default_max_tokens=12)
    params = {"temperature": 0.7, "top_p": 0.9, "top_k": None, "repetition_penalty": 1.0, "logprobs": True, "seed": 5}

    async def two_turns():
        await manager.generate("t", prompt_ids=[1], sampling_params=params)
        await manager.generate("t", prompt_ids=[1, 2], sampling_params=params)

    asyncio.run(two_turns())
    (_, p0), (_, p1) = rep.calls
    assert p0.temperature == 0.7 and p0.top_k == -1 and p0.max_tokens == 12 and p0.logprobs
    assert p0.seed == 5 and p1.seed == derive_seed(5, 1) != 5
    with pytest.raises(ValueError, match="repetition_penalty"):
        manager.to_sampling_params({"repetition_penalty": 1.2})
    with pytest.raises(ValueError, match="unknown key"):
        manager.to_sampling_params({"temprature": 1.0})
    assert manager.to_sampling_params({"temperature": 0.0}).greedy


def test_in_process_replica_batches_concurrent_trajectories(engine):
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    try:
        manager = AsyncLLMServerManager([InProcessReplica(server)], default_max_tokens=5)
        prompts = [_ids(tok, f"{i}+{i}=") for i in range(6)]

        async def many():
            return await asyncio.gather(*(manager.generate(f"t{i}", prompt_ids=p, sampling_params=GREEDY)
                                          for i, p in enumerate(prompts)))

        outs = asyncio.run(many())
        expected = eng.generate_batch(prompts, GREEDY)
        assert [o.token_ids for o in outs] == [e.token_ids for e in expected]
    finally:
        server.close()


class _StreamHost:
    """A Ray actor hosting a server the way a hybrid worker does (generator method in the rollout group)."""

    def __init__(self, model_dir):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
        self.server = RolloutServer(create_rollout_engine("hf", model=model, tokenizer=tok, seed=0), name="ray-host")
        self.stream_calls = 0

    def replica(self):
        from hybridflow.rollout.service.replica import replica_for_server

        return replica_for_server(self.server, "rollout_stream")

    def rollout_stream(self, requests):
        self.stream_calls += 1
        yield from self.server.stream(requests)

    def count(self):
        return self.stream_calls


@pytest.mark.ray
def test_ray_replica_coalesces_a_tick_of_requests_into_one_stream(ray_cluster, tiny_model_dir, engine):
    ray = ray_cluster
    from hybridflow.rollout.service.replica import RAY_ROLLOUT_CONCURRENCY_GROUP, RayActorReplica

    eng, tok = engine
    host = ray.remote(concurrency_groups={RAY_ROLLOUT_CONCURRENCY_GROUP: 8})(_StreamHost).remote(tiny_model_dir)
    replica = ray.get(host.replica.remote())
    assert isinstance(replica, RayActorReplica)
    prompts = [_ids(tok, f"{i}+1=") for i in range(5)]

    async def many():
        return await asyncio.gather(*(replica.generate(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)))

    outs = asyncio.run(many())
    assert [o.token_ids for o in outs] == [e.token_ids for e in eng.generate_batch(prompts, GREEDY)]
    assert ray.get(host.count.remote()) == 1  # five requests, one Ray call
    ray.kill(host)
    from hybridflow.rollout.service.replica import ReplicaError

    with pytest.raises(ReplicaError, match="ray-host"):
        asyncio.run(replica.generate("late", prompts[0], GREEDY))


def test_one_replica_serves_two_event_loops_at_once(engine):
    """Async training's rollouter and validation run their agent loops on two event loops over the same replica.
    A request made on loop B while loop A's batch is still being collected must travel in B's own batch and be
    answered on B: completed from A's thread, B's loop would not wake up until its next timer."""
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    replica = InProcessReplica(server)
    a_collecting, b_requested = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def loop_a():
        async def main():
            task = asyncio.ensure_future(replica.generate("a", _ids(tok, "1+2="), GREEDY))
            await asyncio.sleep(0)  # the request is in A's batch, A's flush is scheduled but has not run
            a_collecting.set()
            b_requested.wait(timeout=30)  # hold A's loop until B has asked
            results["a"] = await task

        asyncio.run(main())

    def loop_b():
        async def main():
            a_collecting.wait(timeout=30)
            task = asyncio.ensure_future(replica.generate("b", _ids(tok, "33+4="), GREEDY))
            await asyncio.sleep(0)
            b_requested.set()
            start = time.perf_counter()
            results["b"] = await asyncio.wait_for(task, timeout=30)
            results["b_seconds"] = time.perf_counter() - start

        asyncio.run(main())

    try:
        threads = [threading.Thread(target=loop_a), threading.Thread(target=loop_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert results["a"].request_id == "a" and results["b"].request_id == "b"
        assert results["b_seconds"] < 10, results["b_seconds"]  # answered, not woken by the 30 s timeout
    finally:
        server.close()


def test_coroutines_run_on_the_servers_loop_reach_the_engine_without_a_thread_hop(engine, monkeypatch):
    """The local backend runs its agent loops on the server's own loop (``RolloutServer.run``): a replica call
    made there goes straight to the engine (no ``submit_many``, no future per request), with the same tokens."""
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    try:
        manager = AsyncLLMServerManager([InProcessReplica(server)], default_max_tokens=5)
        prompts = [_ids(tok, f"{i}+{i}=") for i in range(6)]
        submitted = []
        real = server.submit_many
        monkeypatch.setattr(server, "submit_many", lambda requests: (submitted.append(len(requests)), real(requests))[1])

        async def many():
            assert threading.current_thread() is server._thread
            return await asyncio.gather(*(manager.generate(f"t{i}", prompt_ids=p, sampling_params=GREEDY)
                                          for i, p in enumerate(prompts)))

        outs = server.run(many())
        assert submitted == []
        assert [o.token_ids for o in outs] == [e.token_ids for e in eng.generate_batch(prompts, GREEDY)]
        assert server._local == {} and server._runs._waiting == {}
    finally:
        server.close()


def _still_serves(server, eng, tok) -> None:
    """After a failed run the server's loop answers the next one exactly as the engine alone would."""
    async def one():
        return await InProcessReplica(server).generate("x", _ids(tok, "1+1="), GREEDY)

    assert server.run(one()).token_ids == eng.generate_batch([_ids(tok, "1+1=")], GREEDY)[0].token_ids


def test_a_run_on_the_servers_loop_cancels_what_it_left_behind(engine):
    """As ``run_async`` on a loop of its own: when the coroutine ends (here with an error), the tasks it started
    are cancelled before ``run`` returns; the loop keeps serving."""
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    left = []
    try:
        async def failing():
            async def forever():
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    left.append("cancelled")
                    raise

            asyncio.ensure_future(forever())
            await asyncio.sleep(0)
            raise ValueError("trajectory bug")

        with pytest.raises(ValueError, match="trajectory bug"):
            server.run(failing())
        assert left == ["cancelled"]
        _still_serves(server, eng, tok)
    finally:
        server.close()


def test_the_engine_keeps_stepping_for_other_callers_when_the_run_that_started_it_ends(engine):
    """A run on the server's loop may be the one whose request started the engine's stepping driver; ending the run
    cancels what the run started, but not that driver: a request of another caller still in flight completes."""
    eng, tok = engine
    server = RolloutServer(eng, name="t")
    try:
        long = GenerateRequest("other", _ids(tok, "9+9="), SamplingParams(do_sample=False, max_tokens=48,
                                                                          ignore_eos=True))

        async def short_run():
            short = asyncio.ensure_future(InProcessReplica(server).generate("mine", _ids(tok, "1+1="), GREEDY))
            await asyncio.sleep(0)  # the driver now exists, started by this run's request
            other = server.submit_many([long])[0]  # another caller's (another thread's) request
            await short
            return other

        other = server.run(short_run())
        assert len(other.result(timeout=30).token_ids) == 48
    finally:
        server.close()


def test_a_keyboard_interrupt_raised_in_a_run_reaches_the_caller_and_the_loop_keeps_serving(engine):
    """A stop request abandons a step stuck in a reward function by raising StepAbandoned (a KeyboardInterrupt) in
    the scoring call; in an agent loop on the server's loop, asyncio lets it leave the loop's ``run_forever``.  The
    ``run`` waiting on it must raise it (not hang), and the server must go on serving."""
    from hybridflow.utils.stopping import StepAbandoned

    eng, tok = engine
    server = RolloutServer(eng, name="t")
    try:
        async def abandoned():
            waiting = asyncio.get_running_loop().create_future()

            async def scorer():  # as the reward loop's flush: its trajectories wait on a future it never sets
                raise StepAbandoned("a stop was requested and the reward function has not answered")

            asyncio.ensure_future(scorer())
            await waiting

        with pytest.raises(StepAbandoned, match="reward function"):
            server.run(abandoned())
        _still_serves(server, eng, tok)
    finally:
        server.close()


def test_a_run_asked_for_from_the_servers_own_loop_is_refused_not_deadlocked(engine):
    eng, _ = engine
    server = RolloutServer(eng, name="t")
    try:
        async def nested():
            async def inner():
                return 1

            return server.run(inner())

        with pytest.raises(RuntimeError, match="loop's own thread"):
            server.run(nested())
    finally:
        server.close()
