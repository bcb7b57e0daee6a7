"""Waits that always end: daemon threads nobody joins, calls with a timeout, event loops that close over stuck
threads, scorers and tools given up after a stop request, in-process reward functions with a timeout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from hybridflow.rewards.custom_function import ScoreFnSpec
from hybridflow.rewards.pool import ERROR, OK, TIMEOUT, ScoringPool
from hybridflow.utils import stopping
from hybridflow.utils.threads import CallTimeout, DaemonExecutor, LoopPoster, call_with_timeout, run_async, settle


def test_a_process_whose_daemon_executor_is_stuck_still_exits():
    """ThreadPoolExecutor threads are joined at exit (a stuck one keeps the process alive forever): ours are not."""
    code = textwrap.dedent("""
        import time
        from hybridflow.utils.threads import DaemonExecutor
        ex = DaemonExecutor(1, "stuck")
        ex.submit(time.sleep, 3600)
        time.sleep(0.2)
        print("leaving")
    """)
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "leaving" in out.stdout
    assert time.monotonic() - start < 30


def test_daemon_executor_runs_work_and_releases_its_threads():
    ex = DaemonExecutor(2, "pair")
    futures = [ex.submit(lambda i=i: i * i) for i in range(6)]
    assert [f.result(5) for f in futures] == [0, 1, 4, 9, 16, 25]
    assert len(ex._shared.threads) <= 2
    with pytest.raises(ZeroDivisionError):
        ex.submit(lambda: 1 / 0).result(5)
    ex.shutdown(wait=True)
    assert not any(t.is_alive() for t in ex._shared.threads)
    with pytest.raises(RuntimeError, match="shut down"):
        ex.submit(lambda: 1)


def test_call_with_timeout_abandons_the_call():
    start = time.monotonic()
    with pytest.raises(CallTimeout, match="did not finish within 0.2 s"):
        call_with_timeout(lambda: time.sleep(30), 0.2, name="slow")
    assert time.monotonic() - start < 2
    assert call_with_timeout(lambda: 7, 1.0) == 7


def test_settle_never_overwrites():
    f = concurrent.futures.Future()
    assert settle(f, 1) and not settle(f, error=RuntimeError("late"))
    assert f.result() == 1


def test_loop_poster_runs_every_post_in_order_with_one_wake_up_per_burst():
    """Callbacks posted from another thread all run on the loop, in order; a burst posted while the loop is busy
    costs one call_soon_threadsafe; a callback that raises does not drop the ones after it."""
    async def main():
        loop = asyncio.get_running_loop()
        poster, seen, wakeups = LoopPoster(loop), [], []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))[1]
        errors = []
        loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx["exception"]))

        def burst(start):
            for i in range(start, start + 50):
                poster.post(lambda i=i: seen.append((threading.get_ident(), i)))
            poster.post(lambda: 1 / 0)

        thread = threading.Thread(target=burst, args=(0,))
        thread.start()
        thread.join()  # the loop is blocked here: the whole burst is pending
        await asyncio.sleep(0.01)
        burst(100)  # from the loop's own thread: still deferred to the next iteration
        assert [i for _, i in seen] == list(range(50))
        await asyncio.sleep(0.01)
        return seen, wakeups, errors, threading.get_ident()

    seen, wakeups, errors, loop_thread = run_async(main())
    assert [i for _, i in seen] == list(range(50)) + list(range(100, 150))
    assert {t for t, _ in seen} == {loop_thread}
    assert len(wakeups) == 2 and len(errors) == 2 and all(isinstance(e, ZeroDivisionError) for e in errors)


def test_loop_poster_holds_the_posts_of_a_block_until_its_end():
    """Inside ``LoopPoster.held()`` a thread's posts (to any number of loops) wait for the end of the block, which
    wakes each loop once; a nested block leaves the flush to the outer one."""
    async def main():
        loop = asyncio.get_running_loop()
        poster, seen, wakeups = LoopPoster(loop), [], []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakeups.append(1), real(*a))[1]
        in_block = []

        def worker():
            with LoopPoster.held():
                for i in range(20):
                    poster.post(lambda i=i: seen.append(i))
                with LoopPoster.held():
                    poster.post(lambda: seen.append("nested"))
                time.sleep(0.05)  # the loop is idle: a post would have run by now
                in_block.append(list(seen))
            poster.post(lambda: seen.append("after"))

        await asyncio.to_thread(worker)
        await asyncio.sleep(0.05)
        return seen, in_block, wakeups

    seen, in_block, wakeups = run_async(main())
    assert in_block == [[]]  # nothing ran while the block was open
    assert seen == list(range(20)) + ["nested", "after"]
    assert len(wakeups) <= 3  # the block's flush, the post after it (and to_thread's own completion)


def test_run_async_does_not_wait_for_a_thread_stuck_in_user_code():
    """``asyncio.run`` joins its default executor: a tool's sync function stuck in ``asyncio.to_thread`` kept the
    agent-loop generation from ever returning, even after the tool's own timeout had fired."""
    async def main():
        try:
            await asyncio.wait_for(asyncio.to_thread(time.sleep, 3600), timeout=0.2)
        except asyncio.TimeoutError:
            return "timed out"

    start = time.monotonic()
    assert run_async(main()) == "timed out"
    assert time.monotonic() - start < 3


@pytest.fixture()
def short_grace(monkeypatch):
    monkeypatch.setattr(stopping, "STOP_GRACE_S", 0.5)
    stopping.clear_stop()
    yield
    stopping.clear_stop()


def test_wait_future_gives_up_after_a_stop_request(short_grace):
    future = concurrent.futures.Future()
    assert stopping.wait_future(_done(3), 1.0, "x") == 3
    threading.Timer(0.2, stopping.request_stop).start()
    start = time.monotonic()
    with pytest.raises(stopping.StepAbandoned, match="the reward function has not answered"):
        stopping.wait_future(future, 60.0, "the reward function")
    assert 0.6 < time.monotonic() - start < 3
    assert issubclass(stopping.StepAbandoned, KeyboardInterrupt)  # what GracefulInterrupt turns into exit 130/143


def _done(value):
    f = concurrent.futures.Future()
    f.set_result(value)
    return f


def test_wait_future_keeps_its_timeout_without_a_stop(short_grace):
    start = time.monotonic()
    with pytest.raises(concurrent.futures.TimeoutError):
        stopping.wait_future(concurrent.futures.Future(), 0.6, "x")
    assert 0.55 < time.monotonic() - start < 2


def test_a_stuck_tool_is_given_up_after_a_stop_request(short_grace):
    from hybridflow.tools import ToolExecutor, function_tool
    from hybridflow.tools.function_tool import get_function_tool

    @function_tool
    def lookup(key: str) -> str:
        """Looks a key up in a service that never answers.

        Args:
            key: what to look up.
        """
        time.sleep(3600)
        return key

    executor = ToolExecutor([get_function_tool("lookup")], timeout_s=60)
    threading.Timer(0.2, stopping.request_stop).start()
    start = time.monotonic()
    with pytest.raises(stopping.StepAbandoned, match="tool lookup has not answered"):
        run_async(executor.call("lookup", {"key": "k"}))
    assert time.monotonic() - start < 3  # not the tool's 60 s timeout


def test_in_process_scoring_times_out_like_a_worker_and_goes_on(tmp_path):
    path = tmp_path / "scores.py"
    path.write_text(textwrap.dedent("""
        import time
        def score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
            if solution_str == "hang":
                time.sleep(3600)
            if solution_str == "raise":
                raise ValueError("bad answer")
            return 1.0
    """))
    spec = ScoreFnSpec(path=str(path), name="score")
    tasks = [dict(data_source="d", solution_str=s, ground_truth="1") for s in ("ok", "hang", "raise", "ok", "hang")]
    inline = ScoringPool(spec, num_workers=0, timeout_s=0.5)
    pooled = ScoringPool(spec, num_workers=1, timeout_s=0.5)
    try:
        start = time.monotonic()
        got = inline.run(tasks)
        assert time.monotonic() - start < 5  # two timeouts of 0.5 s, not an hour
        assert [r.status for r in got] == [OK, TIMEOUT, ERROR, OK, TIMEOUT]
        assert [r.status for r in pooled.run(tasks)] == [r.status for r in got]  # the same as in a worker
        assert "bad answer" in got[2].error and "timeout_s=0.5" in got[1].error
        assert inline.abandoned == 2
    finally:
        inline.close()
        pooled.close()


def test_in_process_scoring_hands_a_batch_to_its_thread_at_once(tmp_path, monkeypatch):
    """The scoring thread takes the whole batch (one hand-over and one wake-up of the caller, not one per sample),
    in order, in one thread."""
    path = tmp_path / "scores.py"
    path.write_text("import threading\nseen = []\n"
                    "def score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                    "    seen.append((solution_str, threading.current_thread().name))\n"
                    "    return float(solution_str)\n")
    pool = ScoringPool(ScoreFnSpec(path=str(path), name="score"), num_workers=0, timeout_s=5)
    submits = []
    real = DaemonExecutor.submit
    monkeypatch.setattr(DaemonExecutor, "submit", lambda self, *a, **k: (submits.append(self.name), real(self, *a, **k))[1])
    try:
        got = pool.run([dict(data_source="d", solution_str=str(i), ground_truth="1") for i in range(12)])
        assert [r.value for r in got] == [float(i) for i in range(12)] and {r.status for r in got} == {OK}
        assert submits == ["reward-inline"]
        seen = pool._fn.__globals__["seen"]
        assert [s for s, _ in seen] == [str(i) for i in range(12)] and len({t for _, t in seen}) == 1
    finally:
        pool.close()


def test_in_process_scoring_is_given_up_after_a_stop_request(tmp_path, short_grace):
    path = tmp_path / "scores.py"
    path.write_text("import time\ndef score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
                    "    time.sleep(3600)\n")
    pool = ScoringPool(ScoreFnSpec(path=str(path), name="score"), num_workers=0, timeout_s=60)
    try:
        threading.Timer(0.2, stopping.request_stop).start()
        start = time.monotonic()
        with pytest.raises(stopping.StepAbandoned):
            pool.run([dict(data_source="d", solution_str="x", ground_truth="1")])
        assert time.monotonic() - start < 3
    finally:
        pool.close()
