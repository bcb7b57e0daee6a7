"""``RolloutServer``: one engine served to callers in any thread, on the engine's own event loop.

An engine's ``generate`` is a coroutine that must run on one event loop (the ``hf`` engine batches every
request in flight on that loop into each forward).  The server owns that loop in a daemon thread, so the
process that hosts the engine -- a hybrid actor worker, a standalone server actor, or the trainer itself
with ``trainer.backend=local`` -- can accept requests from anywhere:

* :meth:`submit` / :meth:`submit_many` from any thread, returning ``concurrent.futures.Future`` s;
* :meth:`stream` from a (Ray) thread: submit a list of requests and yield their outputs in completion
  order, grouped by what finished together (one Ray streaming call carries many requests);
* :meth:`call` runs a function on the loop thread, serialised with generation (e.g. ``sleep``);
* :meth:`run` runs a coroutine -- the agent loops of ``trainer.backend=local`` -- on the loop itself, where
  :meth:`serve` takes their requests with no thread hop (an ``InProcessReplica`` called on this loop uses it).

Requests submitted together are scheduled in one loop callback, so they reach the engine before its next
step and share its prefill.

Nothing a caller waits on can hang: an engine failure reaches every request as an
:class:`~hybridflow.rollout.base.EngineError` (tagged with the server's name), and a
:class:`~hybridflow.rollout.service.watchdog.StallWatchdog` fails the requests and control calls of a server that
makes no progress for ``stall_timeout_s`` (``actor_rollout_ref.rollout.stall_timeout_s``); after that the
server refuses new work with the same error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from hybridflow.rollout.base import EngineError, RolloutEngine, TokenOutput
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.rollout.service.watchdog import StallWatchdog
from hybridflow.utils.threads import LoopRuns, outside_runs, settle

__all__ = ["GenerateRequest", "RolloutServer"]


@dataclass(frozen=True)
class GenerateRequest:
    """One token-in/token-out request as it travels from a replica client to a server."""

    request_id: str
    prompt_ids: list[int]
    sampling_params: SamplingParams
    multi_modal_data: dict[str, Any] | None = None


class RolloutServer:
    """Hosts ``engine`` on a private event loop in a daemon thread; thread-safe front door.

    ``stall_timeout_s``: the watchdog's limit (see the module docstring); 0 disables it."""

    def __init__(self, engine: RolloutEngine, name: str = "rollout", stall_timeout_s: float = 300.0):
        self.engine = engine
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._runs = LoopRuns(self._loop, name)  # run(): coroutines of other threads on this loop
        self._thread = threading.Thread(target=self._runs.serve_forever, name=f"{name}-loop", daemon=True)
        self._thread.start()
        self._closed = False
        self._lock = threading.Lock()
        self._inflight: dict[int, concurrent.futures.Future] = {}
        # requests served on the loop itself (serve): [task awaiting it, the error it must raise when cancelled]
        self._local: dict[int, list] = {}
        self._calls: dict[int, tuple[concurrent.futures.Future, str]] = {}
        self._finished = 0  # requests and control calls that ended (the watchdog's progress signal)
        self.failed: EngineError | None = None  # set by the watchdog: the server refuses new work
        progress = getattr(engine, "progress", None) or (lambda: (0, "generating"))
        self.watchdog = StallWatchdog(name, stall_timeout_s, self._watch_state, progress, self._fail).start()

    # ------------------------------------------------------------------ requests
    def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
        """Start one request; the future holds its ``TokenOutput`` (or the engine's exception)."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[GenerateRequest]) -> list[concurrent.futures.Future]:
        """Start several requests in one loop callback (they join the engine's next step together)."""
        self._check_open()
        futures = [concurrent.futures.Future() for _ in requests]
        if self.failed is not None:
            for future in futures:
                settle(future, error=self.failed)
            return futures
        with self._lock:
            self._inflight.update((id(f), f) for f in futures)
        for future in futures:
            future.add_done_callback(self._ended)

        def start() -> None:
            for request, future in zip(requests, futures):
                task = self._loop.create_task(self._generate(request))
                task.add_done_callback(lambda t, f=future: self._copy_result(t, f))

        # a fresh context: the request's task is the server's, not part of a run of the caller's (RolloutServer.run)
        self._loop.call_soon_threadsafe(start, context=contextvars.Context())
        return futures

    def _ended(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._inflight.pop(id(future), None)
            self._finished += 1

    def _copy_result(self, task: asyncio.Task, future: concurrent.futures.Future) -> None:
        if task.cancelled():
            settle(future, error=EngineError(f"rollout server '{self.name}' was closed while the request was in "
                                             "flight"))
        elif task.exception() is not None:
            settle(future, error=self._tagged(task.exception()))
        else:
            settle(future, task.result())

    def _tagged(self, exc: BaseException) -> BaseException:
        """An engine failure names this server (once: the same error reaches every request it held)."""
        if isinstance(exc, EngineError) and getattr(exc, "replica", None) is None:
            exc.replica = self.name
            if f"'{self.name}'" not in str(exc):
                exc.args = (f"rollout replica '{self.name}': {exc}",)
        return exc

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the engine is served on (its own daemon thread)."""
        return self._loop

    async def serve(self, request: GenerateRequest) -> TokenOutput:
        """One request from a coroutine running on this server's own loop (:meth:`run`): the engine's output,
        with no thread hop and no future per request.  It fails as submitted requests do: an engine error names
        the server; the watchdog and :meth:`close` fail it with their ``EngineError``."""
        self._check_open()
        if self.failed is not None:
            raise self.failed
        entry = [asyncio.current_task(), None]
        key = id(entry)
        with self._lock:
            self._local[key] = entry
        try:
            with outside_runs():  # what the engine starts to serve it (its driver) outlives the caller's run
                return await self._generate(request)
        except asyncio.CancelledError:
            if entry[1] is None:  # the caller's own cancellation
                raise
            entry[0].uncancel()
            raise entry[1] from None
        except BaseException as exc:
            self._tagged(exc)
            raise
        finally:
            with self._lock:
                self._local.pop(key, None)
                self._finished += 1

    def run(self, main):
        """Run the coroutine ``main`` on this server's loop and wait for it in the calling thread, as
        ``asyncio.run`` would on a loop of its own (see :class:`~hybridflow.utils.threads.LoopRuns`: what it started
        is cancelled when it ends).  The watchdog and :meth:`close` fail the call too, even when the loop's thread
        is stuck in a coroutine and ``main`` can never end."""
        if self._closed or self.failed is not None:
            if asyncio.iscoroutine(main):
                main.close()
            self._check_open()
            raise self.failed
        return self._runs.run(main)

    def _fail_local(self, error: EngineError) -> None:
        """Make every request served on the loop raise ``error`` (thread-safe: its tasks are cancelled there)."""
        with self._lock:
            entries = list(self._local.values())
            for entry in entries:
                entry[1] = error
        if not entries:
            return

        def cancel() -> None:
            for task, _ in entries:
                if task is not None and not task.done():
                    task.cancel()

        try:
            self._loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the loop is closed: its tasks are gone already
            pass

    async def _generate(self, request: GenerateRequest) -> TokenOutput:
        kwargs = {"multi_modal_data": request.multi_modal_data} if request.multi_modal_data else {}
        return await self.engine.generate(request.prompt_ids, request.sampling_params, request.request_id, **kwargs)

    def stream(self, requests: Sequence[GenerateRequest]) -> Iterator[list[tuple[int, TokenOutput | BaseException]]]:
        """Submit ``requests`` and yield ``[(index, output), ...]`` batches as they complete.

        Every index appears exactly once.  A request the engine failed on yields its exception object in
        place of the output, so one bad request (a prompt longer than ``max_model_len``) fails alone.
        """
        futures = self.submit_many(requests)
        index = {future: i for i, future in enumerate(futures)}
        pending = set(futures)
        while pending:
            done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            yield [(index[f], f.exception() or f.result()) for f in done]

    # ------------------------------------------------------------------ control
    def call(self, fn: Callable[[], Any], timeout: float | None = None, what: str = "control") -> Any:
        """Run ``fn()`` on the loop thread (between engine steps) and return its result.  ``what`` names the
        call in a watchdog error (``"weights"``, ``"sleep"``, ...): a call that does not return within
        ``stall_timeout_s`` fails with it."""
        self._check_open()
        if self.failed is not None:
            raise self.failed
        waiter: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._calls[id(waiter)] = (waiter, what)

        async def run() -> None:
            try:
                settle(waiter, fn())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                settle(waiter, error=exc)

        asyncio.run_coroutine_threadsafe(run(), self._loop)
        try:
            return waiter.result(timeout)
        finally:
            with self._lock:
                self._calls.pop(id(waiter), None)
                self._finished += 1

    # ------------------------------------------------------------------ watchdog
    def _watch_state(self) -> tuple[int, list[str], int, bool]:
        with self._lock:
            inflight = len(self._inflight) + len(self._local)
            return inflight, [what for _, what in self._calls.values()], self._finished, self._paused()

    def _paused(self) -> bool:
        """Requests held back on purpose (an interrupted server): no progress is expected from them."""
        return False

    def _fail(self, error: EngineError) -> None:
        """Fail every request and call this server holds with ``error``; later ones fail at once."""
        self.failed = error
        with self._lock:
            waiting = list(self._inflight.values()) + [f for f, _ in self._calls.values()]
        for future in waiting:
            settle(future, error=error)
        self._fail_local(error)
        self._runs.fail(error)

    def close(self) -> None:
        """Stop the loop thread; requests still in flight fail with an ``EngineError``."""
        if self._closed:
            return
        self._closed = True
        self.watchdog.stop()
        closed = EngineError(f"rollout server '{self.name}' was closed while a request or call was in flight")
        with self._lock:
            waiting = list(self._inflight.values()) + [f for f, _ in self._calls.values()]
        for future in waiting:
            settle(future, error=closed)
        self._fail_local(closed)
        self._runs.fail(closed)

        async def stop() -> None:
            tasks = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"rollout server '{self.name}' is closed")

