"""Scoring in worker processes with a per-task timeout: a reward function can never hang or kill the run.

Rule scorers are arbitrary user Python: they may raise, loop forever (a pathological regex, sympy on a huge
expression) or crash the interpreter. ``concurrent.futures.ProcessPoolExecutor`` cannot cancel a running task,
and a hung task blocks its worker for good, so we keep a small pool of our own: each worker is a fresh
interpreter (safe next to Ray, CUDA and OpenMP threads, unlike fork) fed one task at a time over a pipe; the
supervisor waits with a deadline and kills + replaces a worker that overruns it. Worker start-up (imports,
loading the user file) is not charged to any task.

``num_workers=0`` scores in the calling process, one sample at a time in a daemon thread of its own, with the
same per-sample timeout: a call that overruns it scores as a timeout (as in a worker) and is left running in
its thread (a thread cannot be killed; nothing waits for it, so it cannot keep the run alive, but a scorer
stuck in a CPU loop keeps costing CPU: prefer worker processes for scorers that may hang); the samples after it
go on in a fresh thread.  The thread takes a whole batch at once and the caller wakes up when it is done (or a
sample overran), not once per sample.  Breakpoints in the function still work; raise ``timeout_s`` while you
sit in one.

Every wait here gives up the step when a stop was requested and the scorer does not answer within a few
seconds (:mod:`hybridflow.utils.stopping`), so a signal ends a run even while a scorer is stuck.

An ``async def`` scoring function (one that waits on a judge, an API, a sandbox) is run *concurrently*, as verl's
reward loop runs it: the batch is split over the workers (or kept in this process with ``num_workers=0``) and each
runs its share as concurrent tasks on one event loop, every task with its own ``timeout_s``; a worker whose event
loop stops answering (blocking code inside the coroutine) is killed after ``timeout_s`` plus a grace period and its
unfinished tasks time out.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from hybridflow.rewards.custom_function import ScoreFnSpec, call_score_fn
from hybridflow.rewards.proc_tree import kill_descendants
from hybridflow.utils.stopping import check_stop
from hybridflow.utils.threads import DaemonExecutor

OK, ERROR, TIMEOUT = "ok", "error", "timeout"
BURST_WORKERS = 16  # after a timeout, the batch's remaining samples run on up to this many workers at once
_PAGE = os.sysconf("SC_PAGE_SIZE")
logger = logging.getLogger(__name__)
_STOP_POLL_S = 0.25  # the longest a wait on workers goes without looking at a stop request
_WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_main.py")


@dataclass
class TaskResult:
    """Outcome of one scoring call: ``status`` is ok / error / timeout; ``error`` holds the traceback text."""

    status: str
    value: Any = None
    error: str | None = None


class _Worker:
    """One scoring process running ``worker_main.py`` (as a script) over two OS pipes.

    Not ``multiprocessing``'s spawn: that re-imports the user's ``__main__`` in the child, so a training
    script without an ``if __name__ == "__main__"`` guard would start training again inside every worker.
    Start-up is asynchronous (:attr:`ready` turns true when the child has loaded the function), so replacing
    a killed worker never delays the other samples of the batch.
    """

    def __init__(self, spec: ScoreFnSpec, start_timeout_s: float):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(  # its own session: what the scorer starts is killed with it (kill)
            [sys.executable, _WORKER_SCRIPT, str(to_child_r), str(from_child_w)],
            pass_fds=(to_child_r, from_child_w), env=env, stdin=subprocess.DEVNULL, start_new_session=True,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.send_conn = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.send_conn.send(spec)
        self.ready = False
        self.start_deadline = time.monotonic() + start_timeout_s

    def handshake(self) -> None:
        """Consume the child's start-up message; raise if it could not load the scoring function."""
        try:
            kind, detail = self.conn.recv()
        except (EOFError, OSError):
            kind, detail = "init_error", f"worker exited with code {self.proc.wait()}"
        if kind != "ready":
            self.kill()
            raise RuntimeError(f"reward worker failed to load the scoring function:\n{detail}")
        self.ready = True

    def send(self, msg: Any) -> None:
        self.send_conn.send(msg)

    def rss_mb(self) -> float:
        """The worker's resident memory (0 once it has exited)."""
        try:
            with open(f"/proc/{self.proc.pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * _PAGE / 2**20
        except (OSError, IndexError, ValueError):
            return 0.0

    def kill(self) -> None:
        """End the worker and everything its scorer started: detached processes are re-parented to the worker
        (a subreaper, ``proc_tree``) or stay in its session, so nothing outlives it."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGSTOP)  # no new children while its tree is killed
            except ProcessLookupError:
                pass
            kill_descendants(self.proc.pid)
            self.proc.kill()
        self.proc.wait(timeout=10)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its session: children that left the tree
        except (ProcessLookupError, PermissionError):
            pass
        self.send_conn.close()
        self.conn.close()

    def stop(self) -> None:
        try:
            self.send_conn.send(None)
            self.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop()
    workers.clear()


class ScoringPool:
    """Runs ``fn(**kwargs)`` for many kwargs dicts on ``num_workers`` processes, each with ``timeout_s``."""

    def __init__(self, spec: ScoreFnSpec, num_workers: int, timeout_s: float, start_timeout_s: float = 300.0,
                 memory_mb: float = 4096.0):
        if num_workers < 0:
            raise ValueError(f"reward scoring num_workers must be >= 0, got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"reward scoring timeout_s must be > 0, got {timeout_s}")
        self.spec = spec
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb  # a worker over it is replaced (between samples) or killed (during one)
        self.recycled = 0  # workers replaced for their memory in the last run()
        self._warned_memory = False
        self.start_timeout_s = start_timeout_s
        self._fn = spec.resolve()  # fail fast in the parent on a bad path / name
        self.concurrent = inspect.iscoroutinefunction(self._fn)
        self._workers: list[_Worker] = []
        self._inline: DaemonExecutor | None = None  # num_workers=0: the thread that runs the scorer
        self.abandoned = 0  # in-process calls left running after their timeout
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def close(self) -> None:
        self._finalizer()
        if self._inline is not None:
            self._inline.shutdown(wait=False)
            self._inline = None

    def run(self, tasks: list[dict[str, Any]]) -> list[TaskResult]:
        self.recycled = 0
        if self.concurrent:
            return self._run_concurrent(tasks)
        if self.num_workers == 0:
            return self._run_inline(tasks)
        try:
            return self._run_in_workers(tasks)
        finally:
            self._trim()

    def _run_in_workers(self, tasks: list[dict[str, Any]]) -> list[TaskResult]:
        """One task per worker at a time, each within ``timeout_s``. After a timeout the batch's other samples
        are spread over up to :data:`BURST_WORKERS` workers, so hung scorers time out together, not one after
        another (issue 34: ~8 min a step at 30 s each)."""
        results: list[TaskResult | None] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (task index, deadline)
        timed_out = False
        while pending or busy:
            self._grow(len(tasks), len(pending) + len(busy), burst=timed_out)
            for slot, worker in enumerate(self._workers):
                if worker.ready and slot not in busy and pending:
                    idx = pending.popleft()
                    worker.send((idx, tasks[idx]))
                    busy[slot] = (idx, time.monotonic() + self.timeout_s)
            watched = [s for s, w in enumerate(self._workers) if s in busy or (pending and not w.ready)]
            deadlines = [busy[s][1] if s in busy else self._workers[s].start_deadline for s in watched]
            readable = wait([self._workers[s].conn for s in watched],
                            timeout=min(max(0.0, min(deadlines) - time.monotonic()), _STOP_POLL_S))
            check_stop("the reward function")
            for slot in [s for s in watched if self._workers[s].conn in readable]:
                if not self._workers[slot].ready:
                    self._workers[slot].handshake()
                else:
                    idx, _ = busy.pop(slot)
                    results[idx] = self._receive(slot)
                    self._recycle_if_bloated(slot)
            timed_out = self._expire(busy, results) or timed_out
        return [r for r in results if r is not None]

    def _grow(self, n_tasks: int, outstanding: int, burst: bool) -> None:
        target = min(self.num_workers, n_tasks)
        if burst:
            target = max(target, min(outstanding, BURST_WORKERS))
        while len(self._workers) < target:
            self._workers.append(_Worker(self.spec, self.start_timeout_s))

    def _trim(self) -> None:
        """Back to ``num_workers`` after a burst."""
        while len(self._workers) > self.num_workers:
            self._workers.pop().stop()

    def _recycle_if_bloated(self, slot: int) -> None:
        """A worker whose memory passed ``memory_mb`` after a sample is replaced (said once per pool)."""
        rss = self._workers[slot].rss_mb()
        if rss <= self.memory_mb:
            return
        self.recycled += 1
        if self._warned_memory:
            self._replace(slot)
            return
        self._warned_memory = True
        logger.warning("reward worker pid %d grew to %.0f MiB, over reward_model.worker_memory_mb=%g: replaced by a "
                       "fresh process (the scoring function keeps memory between calls, a leak or a cache; raise "
                       "the key if it needs that much; further replacements are counted in reward/workers_recycled)",
                       self._workers[slot].proc.pid, rss, self.memory_mb)
        self._replace(slot)

    def _expire(self, busy: dict[int, tuple[int, float]], results: list[TaskResult | None]) -> bool:
        """Time out (and replace) overdue workers, kill ones over ``memory_mb``; True when something timed out."""
        now = time.monotonic()
        overdue = [s for s, (_, deadline) in busy.items() if deadline <= now]
        for slot in overdue:
            idx, _ = busy.pop(slot)
            results[idx] = TaskResult(TIMEOUT, error=f"scoring exceeded timeout_s={self.timeout_s}")
            self._replace(slot)
        for slot in [s for s in busy if self._workers[s].rss_mb() > self.memory_mb]:  # growing inside one call
            idx, _ = busy.pop(slot)
            results[idx] = TaskResult(ERROR, error=f"MemoryError: scoring used over reward_model.worker_memory_mb="
                                                   f"{self.memory_mb:g} MiB; the worker was killed")
            self.recycled += 1
            self._replace(slot)
        for worker in self._workers:
            if not worker.ready and worker.start_deadline <= now and worker.conn.poll() is False:
                raise RuntimeError(f"reward worker did not start within {self.start_timeout_s:.0f}s")
        return bool(overdue)

    def _run_concurrent(self, tasks: list[dict[str, Any]]) -> list[TaskResult]:
        """Coroutine scorers: each worker (or this process) runs its share of ``tasks`` concurrently."""
        if not tasks:
            return []
        if self.num_workers == 0:
            return [TaskResult(*r) for r in run_tasks_concurrently(self._fn, list(enumerate(tasks)), self.timeout_s)]
        n = min(self.num_workers, len(tasks))
        while len(self._workers) < n:
            self._workers.append(_Worker(self.spec, self.start_timeout_s))
        for worker in self._workers[:n]:
            if not worker.ready:
                if not worker.conn.poll(max(0.0, worker.start_deadline - time.monotonic())):
                    raise RuntimeError(f"reward worker did not start within {self.start_timeout_s:.0f}s")
                worker.handshake()
        shares = [list(range(len(tasks)))[i::n] for i in range(n)]
        for worker, share in zip(self._workers, shares):
            worker.send(("batch", [(i, tasks[i]) for i in share], self.timeout_s))
        results: list[TaskResult | None] = [None] * len(tasks)
        deadline = time.monotonic() + self.timeout_s + 5.0
        waiting = dict(enumerate(shares))
        while waiting:
            readable = wait([self._workers[s].conn for s in waiting], timeout=max(0.0, deadline - time.monotonic()))
            if not readable:
                break
            for slot in [s for s in waiting if self._workers[s].conn in readable]:
                share = waiting.pop(slot)
                try:
                    _, replies = self._workers[slot].conn.recv()
                    for idx, status, payload in replies:
                        results[idx] = TaskResult(status, payload if status == OK else None,
                                                  None if status == OK else payload)
                    self._recycle_if_bloated(slot)
                except (EOFError, OSError):
                    code = self._workers[slot].proc.poll()
                    for idx in share:
                        results[idx] = TaskResult(ERROR, error=f"reward worker process died (exit code {code})")
                    self._replace(slot)
        for slot, share in waiting.items():  # an event loop that stopped answering: kill, the rest timed out
            for idx in share:
                results[idx] = TaskResult(TIMEOUT, error=f"scoring exceeded timeout_s={self.timeout_s}")
            self._replace(slot)
        return [r for r in results if r is not None]

    def _run_inline(self, tasks: list[dict[str, Any]]) -> list[TaskResult]:
        """``tasks`` one after the other in the in-process scoring thread, each within ``timeout_s``."""
        results: list[TaskResult | None] = [None] * len(tasks)
        first = 0
        while first < len(tasks):
            if self._inline is None:
                self._inline = DaemonExecutor(max_workers=1, name="reward-inline")
            batch = _InlineBatch(time.monotonic(), first)
            self._inline.submit(_score_in_turn, self._fn, tasks, first, results, batch)
            overran = self._wait_inline(batch)
            if overran is None:
                break
            # its thread stays stuck in the call: the samples after it go on in a new one
            self._inline.shutdown(wait=False)
            self._inline = None
            self.abandoned += 1
            results[overran] = TaskResult(TIMEOUT, error=f"scoring exceeded timeout_s={self.timeout_s} (in-process; the "
                                                          "call was left running in its thread)")
            first = overran + 1
        return results  # type: ignore[return-value]

    def _wait_inline(self, batch: "_InlineBatch") -> int | None:
        """Wait for the scoring thread to finish ``batch``: None, or the index of the sample that overran
        ``timeout_s`` (the thread then scores nothing more of this batch).  A stop request gives up the step."""
        try:
            while True:
                with batch.lock:
                    index, started = batch.index, batch.started
                left = started + self.timeout_s - time.monotonic()
                if batch.done.wait(max(0.0, min(_STOP_POLL_S, left))):
                    if batch.raised is not None:  # not an Exception (SystemExit ...): the caller's to handle
                        raise batch.raised
                    return None
                with batch.lock:
                    if batch.index == index and time.monotonic() >= batch.started + self.timeout_s:
                        batch.given_up = True
                        return max(index, batch.first)
                check_stop("the reward function")
        except BaseException:
            with batch.lock:
                batch.given_up = True
            raise

    def _receive(self, slot: int) -> TaskResult:
        worker = self._workers[slot]
        try:
            _, status, payload = worker.conn.recv()
        except (EOFError, OSError):
            code = worker.proc.poll()
            self._replace(slot)
            return TaskResult(ERROR, error=f"reward worker process died (exit code {code}) while scoring")
        return TaskResult(OK, payload) if status == OK else TaskResult(ERROR, error=payload)

    def _replace(self, slot: int) -> None:
        self._workers[slot].kill()
        self._workers[slot] = _Worker(self.spec, self.start_timeout_s)


class _InlineBatch:
    """One batch of in-process scoring, shared by the scoring thread and the waiting caller.  ``index`` is the
    sample under way (-1 before the first) and ``started`` when it (or the batch) started; once ``given_up`` the
    thread records and starts nothing more."""

    def __init__(self, now: float, first: int):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.first = first
        self.index = -1
        self.started = now
        self.given_up = False
        self.raised: BaseException | None = None


def _score_in_turn(fn, tasks: list[dict[str, Any]], first: int, results: list, batch: _InlineBatch) -> None:
    """The scoring thread's side of :meth:`ScoringPool._run_inline`: ``tasks[first:]`` in order."""
    for i in range(first, len(tasks)):
        with batch.lock:
            if batch.given_up:
                return
            batch.index, batch.started = i, time.monotonic()
        try:
            result = TaskResult(OK, call_score_fn(fn, tasks[i]))
        except Exception:  # noqa: BLE001 - the sample scores as an error, with the traceback
            result = TaskResult(ERROR, error=traceback.format_exc())
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            with batch.lock:
                if not batch.given_up:
                    batch.raised = exc
            batch.done.set()
            return
        with batch.lock:
            if batch.given_up:
                return
            results[i] = result
    batch.done.set()


def run_tasks_concurrently(fn, tasks: list[tuple[int, dict[str, Any]]], timeout_s: float) -> list[tuple[str, Any, Any]]:
    """``(status, value, error)`` per task of a coroutine function ``fn``, run as concurrent tasks of one event loop
    (a helper thread's when this thread already runs one), each bounded by ``timeout_s``."""

    async def one(kwargs):
        try:
            return OK, await asyncio.wait_for(fn(**kwargs), timeout_s), None
        except asyncio.TimeoutError:
            return TIMEOUT, None, f"scoring exceeded timeout_s={timeout_s}"
        except Exception:
            return ERROR, None, traceback.format_exc()

    async def everything():
        return await asyncio.gather(*(one(kwargs) for _, kwargs in tasks))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return list(asyncio.run(everything()))
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as ex:
        return list(ex.submit(asyncio.run, everything()).result())
