"""Threads that can never keep a process alive, and waits that always end.

Python joins every ``concurrent.futures.ThreadPoolExecutor`` thread at interpreter exit, and ``asyncio.run``
joins its default executor's threads before it returns.  A thread stuck in user code (a reward function
that sleeps forever, a tool blocked on a socket) or in an engine forward therefore turns an error, a
finished run or a Ctrl-C into a process that never exits.  The helpers here run such work in *daemon*
threads that nobody joins:

* :class:`DaemonExecutor` -- an ``Executor`` of daemon threads (the ``hf`` engine's stepping thread, the
  reward-scoring threads, an event loop's default executor); ``shutdown`` never waits for a stuck task;
* :func:`call_with_timeout` -- ``fn()`` in a fresh daemon thread, abandoned (left running) after
  ``timeout_s``, with :class:`CallTimeout` raised to the caller;
* :func:`run_async` -- ``asyncio.run`` whose default executor is a :class:`DaemonExecutor` and whose
  shutdown does not wait for it;
* :class:`LoopRuns` -- the same for a loop that a thread of its own serves forever: other threads run
  coroutines there and wait for them, and what a coroutine started is cancelled when it ends;
* :func:`settle` -- resolve a ``concurrent.futures.Future`` unless something else already did (a watchdog
  and the real result may race);
* :class:`LoopPoster` -- run callbacks posted from other threads on an event loop, one wake-up per burst (an
  engine step that finishes 128 requests wakes the loop once, not 128 times).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import itertools
import queue
import threading
import weakref
from typing import Any, Awaitable, Callable, TypeVar

__all__ = ["CallTimeout", "DaemonExecutor", "LoopPoster", "LoopRuns", "call_with_timeout", "outside_runs",
           "run_async", "settle"]

T = TypeVar("T")


class CallTimeout(TimeoutError):
    """:func:`call_with_timeout` stopped waiting; the call itself may still be running in its thread."""


def settle(future: concurrent.futures.Future, result: Any = None, error: BaseException | None = None) -> bool:
    """Set ``future``'s exception (``error``) or result unless it is already done; True if this call did."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
        return True
    except concurrent.futures.InvalidStateError:
        return False


_HELD = threading.local()  # .posters: the LoopPosters a LoopPoster.held() block of this thread posted to


class LoopPoster:
    """Runs callbacks posted from any thread on ``loop``, in posting order; posts that arrive before the loop
    runs the pending ones share one ``call_soon_threadsafe`` (one self-pipe write and one wake-up per burst
    instead of one per callback: 1-2 us of syscall and a loop iteration each, at 128 finished requests a
    step).  A callback that raises is reported to the loop's exception handler; the others still run.

    Inside :meth:`held` the posts of the calling thread wait for the end of the block, which wakes each loop
    once: an engine step that finishes requests one by one (each post would otherwise wake the loop, which
    then competes with the step for the GIL) and then reports its own end costs one wake-up."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: collections.deque[Callable[[], Any]] = collections.deque()
        self._scheduled = False

    def post(self, fn: Callable[[], Any]) -> None:
        held = getattr(_HELD, "posters", None)
        with self._lock:
            self._pending.append(fn)
            if self._scheduled:
                return
            if held is not None:
                held[id(self)] = self
                return
            self._scheduled = True
        self._wake()

    def flush(self) -> None:
        """Wake the loop for the callbacks posted so far, unless a wake-up is on its way already."""
        with self._lock:
            if self._scheduled or not self._pending:
                return
            self._scheduled = True
        self._wake()

    def _wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody is left to run them
            with self._lock:
                self._scheduled = False
                self._pending.clear()
            raise

    @staticmethod
    @contextlib.contextmanager
    def held():
        """Posts made by this thread inside the block reach their loops when it ends, one wake-up per loop
        (a loop closed meanwhile is skipped: nobody is left to run them)."""
        if getattr(_HELD, "posters", None) is not None:  # nested: the outer block flushes
            yield
            return
        _HELD.posters = {}
        try:
            yield
        finally:
            posters, _HELD.posters = _HELD.posters, None
            for poster in posters.values():
                try:
                    poster.flush()
                except RuntimeError:
                    pass

    def _drain(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, collections.deque()
            self._scheduled = False
        for fn in batch:
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - one bad callback must not drop the rest
                self.loop.call_exception_handler({"message": "LoopPoster callback failed", "exception": exc})


class _Shared:
    """What a :class:`DaemonExecutor`'s threads share (not the executor itself: when nothing else holds the
    executor it is collected, and its idle threads are told to exit)."""

    def __init__(self):
        self.work: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0
        self.threads: list[threading.Thread] = []


def _work(shared: _Shared) -> None:
    while True:
        with shared.lock:
            shared.idle += 1
        item = shared.work.get()
        with shared.lock:
            shared.idle -= 1
        if item is None:
            return
        future, fn, args, kwargs = item
        if future.set_running_or_notify_cancel():
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                settle(future, error=exc)
            else:
                settle(future, result)
        del item, future, fn, args, kwargs


def _release(shared: _Shared) -> None:
    for _ in list(shared.threads):
        shared.work.put(None)


class DaemonExecutor(concurrent.futures.ThreadPoolExecutor):
    """Up to ``max_workers`` daemon threads named ``{name}_{i}``, started on demand and kept while idle.

    Unlike ``ThreadPoolExecutor``'s, its threads are not joined at interpreter exit, and ``shutdown(wait=True)``
    waits only ``join_timeout_s`` for tasks under way, so a task that never returns cannot hang the process.
    Idle threads exit when the executor is shut down or garbage-collected.  (It subclasses
    ``ThreadPoolExecutor`` only because asyncio accepts nothing else as a default executor; none of the
    parent's machinery is used.)
    """

    def __init__(self, max_workers: int = 1, name: str = "hybridflow-daemon", join_timeout_s: float = 5.0):
        if max_workers < 1:
            raise ValueError(f"DaemonExecutor needs max_workers >= 1, got {max_workers}")
        super().__init__(max_workers=max_workers, thread_name_prefix=name)
        self.max_workers = int(max_workers)
        self.name = name
        self.join_timeout_s = float(join_timeout_s)
        self._shared = _Shared()
        self._closed = False
        self._ids = itertools.count()
        self._release = weakref.finalize(self, _release, self._shared)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        shared = self._shared
        with shared.lock:
            if self._closed:
                raise RuntimeError(f"executor '{self.name}' was shut down")
            shared.work.put((future, fn, args, kwargs))
            if shared.work.qsize() > shared.idle and len(shared.threads) < self.max_workers:
                thread = threading.Thread(target=_work, args=(shared,), name=f"{self.name}_{next(self._ids)}",
                                          daemon=True)
                shared.threads.append(thread)
                thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        shared = self._shared
        with shared.lock:
            if self._closed:
                return
            self._closed = True
            threads = list(shared.threads)
        if cancel_futures:
            while True:
                try:
                    item = shared.work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        self._release()
        if wait:
            for thread in threads:
                thread.join(self.join_timeout_s)


def call_with_timeout(fn: Callable[[], T], timeout_s: float | None, name: str = "hybridflow-call") -> T:
    """``fn()`` in a daemon thread; its result or exception, or :class:`CallTimeout` after ``timeout_s``
    (the thread is then left to finish on its own).  ``None`` waits as long as it takes -- interruptibly:
    the calling thread keeps handling signals meanwhile."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def target() -> None:
        try:
            settle(future, fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            settle(future, error=exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        raise CallTimeout(f"{name} did not finish within {timeout_s:g} s") from None


def run_async(main: Awaitable[T], name: str = "hybridflow-loop") -> T:
    """``asyncio.run(main)`` for code that may hand blocking work to the loop's default executor
    (``asyncio.to_thread``, ``run_in_executor(None, ...)``): that executor is a :class:`DaemonExecutor`, and
    leaving the loop (result, error or KeyboardInterrupt) cancels what is left without waiting for a thread
    stuck in such work."""
    loop = asyncio.new_event_loop()
    executor = DaemonExecutor(max_workers=32, name=f"{name}-executor", join_timeout_s=0.0)
    loop.set_default_executor(executor)
    created: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()

    def task_factory(loop, coro, context=None):
        task = asyncio.Task(coro, loop=loop, context=context)
        created.add(task)
        return task

    loop.set_task_factory(task_factory)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    except (KeyboardInterrupt, SystemExit):
        # it left the loop through the task that raised it (asyncio re-raises these at once): that task's
        # copy is the one raised here, not an exception nobody retrieved
        for task in list(created):
            if task.done() and not task.cancelled():
                task.exception()
        raise
    finally:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False)
            asyncio.set_event_loop(None)
            loop.close()


# The tasks of the LoopRuns.run call a task was created under (a task inherits its creator's context).
_RUN_TASKS: contextvars.ContextVar[weakref.WeakSet | None] = contextvars.ContextVar("hybridflow_run_tasks",
                                                                                    default=None)
_CANCEL_WAIT_S = 5.0  # a finished run waits this long at most for the tasks it cancels to end


class LoopRuns:
    """An event loop served forever by a thread of its own, on which other threads run coroutines and wait for
    them -- :meth:`run`, which behaves as :func:`run_async` does on a loop of its own:

    * the loop's default executor is a :class:`DaemonExecutor` (``asyncio.to_thread`` work stuck in user code
      never keeps the process alive);
    * when the coroutine ends, the tasks it started (directly or not) that are still pending are cancelled, and
      waited for at most 5 s; when the waiting thread leaves early (KeyboardInterrupt) they are cancelled without
      a wait;
    * a KeyboardInterrupt or SystemExit raised in any task of a run (asyncio lets it leave ``run_forever``) ends
      that run with it, in the waiting thread; the loop goes on serving.

    :meth:`fail` ends every waiting run with an error from any thread, even when the loop's thread is stuck in a
    coroutine and they could never end.  Tasks started inside :func:`outside_runs` belong to no run."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str = "hybridflow-loop"):
        self.loop = loop
        loop.set_default_executor(DaemonExecutor(max_workers=32, name=f"{name}-executor", join_timeout_s=0.0))
        loop.set_task_factory(self._task)
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[concurrent.futures.Future, weakref.WeakSet]] = {}
        self._thread_id: int | None = None  # the thread serving the loop

    @staticmethod
    def _task(loop, coro, context=None):
        task = asyncio.Task(coro, loop=loop, context=context)
        tasks = context.get(_RUN_TASKS) if context is not None else _RUN_TASKS.get()
        if tasks is not None:
            tasks.add(task)
        return task

    def serve_forever(self) -> None:
        """The loop's thread: run it until it is stopped."""
        self._thread_id = threading.get_ident()
        while True:
            try:
                self.loop.run_forever()
                return
            except BaseException as exc:  # noqa: BLE001 - a task's KeyboardInterrupt / SystemExit: its run's
                self._deliver(exc)

    def _deliver(self, exc: BaseException) -> None:
        with self._lock:
            waiting = list(self._waiting.values())
        for done, tasks in waiting:
            if any(t.done() and not t.cancelled() and t.exception() is exc for t in list(tasks)):
                settle(done, error=exc)

    def fail(self, error: BaseException) -> None:
        """End every run waiting now with ``error`` (their tasks are then cancelled)."""
        with self._lock:
            waiting = [done for done, _ in self._waiting.values()]
        for done in waiting:
            settle(done, error=error)

    def run(self, main: Awaitable[T]) -> T:
        """Run ``main`` on the loop and wait for its result in this thread (see the class docstring)."""
        if threading.get_ident() == self._thread_id:  # it would wait for itself forever
            if asyncio.iscoroutine(main):
                main.close()
            raise RuntimeError("LoopRuns.run() called from the loop's own thread (a coroutine on this loop can await "
                               "the work directly)")
        done: concurrent.futures.Future = concurrent.futures.Future()
        tasks: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()  # touched on the loop's thread only
        context = contextvars.copy_context()
        context.run(_RUN_TASKS.set, tasks)
        started: list[asyncio.Task] = []
        key = id(done)
        with self._lock:
            self._waiting[key] = (done, tasks)
        try:
            self._submit(main, _run_starter(self.loop, main, done, tasks, started), context)
            return done.result()
        finally:
            with self._lock:
                self._waiting.pop(key, None)
            if not (started and started[0].done()):  # left early: interrupted, failed, or the loop is stuck
                try:
                    self.loop.call_soon_threadsafe(_cancel_pending, tasks)
                except RuntimeError:  # the loop is closed: nothing is left to run them
                    pass

    def _submit(self, main: Awaitable, start: Callable[[], None], context: contextvars.Context) -> None:
        """Have the loop call ``start`` (in ``context``); a closed loop closes ``main`` unstarted and raises."""
        try:
            self.loop.call_soon_threadsafe(start, context=context)
        except RuntimeError:  # the loop is closed
            if asyncio.iscoroutine(main):
                main.close()
            raise


def _run_starter(loop: asyncio.AbstractEventLoop, main: Awaitable, done: concurrent.futures.Future,
                 tasks: weakref.WeakSet, started: list[asyncio.Task]) -> Callable[[], None]:
    """The callback that starts ``main`` as a task on ``loop`` (appended to ``started``).  When the task ends, the
    tasks of its run still pending (``tasks``) are cancelled and waited for, ``_CANCEL_WAIT_S`` at most, before
    its outcome settles ``done``."""

    def finished(task: asyncio.Task) -> None:
        left = _cancel_pending(tasks)
        if not left:
            _settle_with(done, task)
            return
        timer = loop.call_later(_CANCEL_WAIT_S, _settle_with, done, task)
        asyncio.gather(*left, return_exceptions=True).add_done_callback(
            lambda _: (timer.cancel(), _settle_with(done, task)))

    def start() -> None:
        task = loop.create_task(main)  # type: ignore[arg-type]
        started.append(task)
        task.add_done_callback(finished)

    return start


def _settle_with(done: concurrent.futures.Future, task: asyncio.Task) -> None:
    """``done`` takes ``task``'s outcome: its result, its exception, or a cancellation."""
    if task.cancelled():
        settle(done, error=asyncio.CancelledError())
    elif task.exception() is not None:
        settle(done, error=task.exception())
    else:
        settle(done, task.result())


@contextlib.contextmanager
def outside_runs():
    """Tasks created inside the block (by the current task) belong to no :meth:`LoopRuns.run` call, so that
    the end of one does not cancel them: a service's own tasks (an engine's stepping driver, started by
    whichever request came first) outlive the run that happened to start them."""
    token = _RUN_TASKS.set(None)
    try:
        yield
    finally:
        _RUN_TASKS.reset(token)


def _cancel_pending(tasks: weakref.WeakSet) -> list[asyncio.Task]:
    """Cancel the tasks of ``tasks`` not done yet (on their loop's thread); returns them."""
    left = [t for t in list(tasks) if not t.done()]
    for task in left:
        task.cancel()
    return left
