"""The trainer's calls into the fully async rollouter (pause / resume) return when the rollouter's stream ends
around them, instead of waiting forever for a coroutine its stopped loop will never run (seen as a hang of
test_rollout_wal's crash test: the stream ended between pause()'s liveness check and its wait)."""
from __future__ import annotations

import asyncio
import threading
import time

from hybridflow.trainer.asynchronous.rollouter import Rollouter


def _rollouter() -> Rollouter:
    return Rollouter(manager=None, fleet=None, samples=iter(()), queue=None, batch_prompts=1, max_samples=None,
                     partial_rollout=False)


def _returns_within(fn, seconds: float):
    result, done = {}, threading.Event()

    def call():
        result["value"] = fn()
        done.set()

    threading.Thread(target=call, daemon=True).start()
    assert done.wait(seconds), f"{fn.__name__} still waiting after {seconds} s"
    return result["value"]


def test_a_call_whose_loop_stops_without_running_it_returns():
    rollouter = _rollouter()
    # the rollouter's loop as the stream leaves it: alive at the check, then the thread ends without the loop
    # ever running what was scheduled on it
    rollouter._loop = asyncio.new_event_loop()
    rollouter._thread = threading.Thread(target=time.sleep, args=(0.3,), daemon=True)
    rollouter._thread.start()
    try:
        assert _returns_within(rollouter.pause, 5.0) is None
        assert _returns_within(lambda: rollouter.resume(3), 5.0) == 0.0
    finally:
        rollouter._loop.close()


def test_a_call_into_a_closed_loop_returns():
    rollouter = _rollouter()
    rollouter._loop = asyncio.new_event_loop()
    rollouter._loop.close()
    rollouter._thread = threading.Thread(target=time.sleep, args=(0.5,), daemon=True)
    rollouter._thread.start()
    assert _returns_within(rollouter.pause, 5.0) is None


def test_a_call_on_a_running_loop_gets_its_result():
    rollouter = _rollouter()
    loop = asyncio.new_event_loop()
    rollouter._loop = loop
    rollouter._thread = threading.Thread(target=loop.run_forever, daemon=True)
    rollouter._thread.start()

    async def slow_answer():
        await asyncio.sleep(0.5)  # longer than one poll of the thread
        return 42

    try:
        assert _returns_within(lambda: rollouter._call(slow_answer()), 5.0) == 42
    finally:
        loop.call_soon_threadsafe(loop.stop)
        rollouter._thread.join(5)
        loop.close()
