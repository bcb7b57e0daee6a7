"""``RolloutServer``: one engine served to callers in any thread, on the engine's own event loop.

An engine's ``generate`` is a coroutine that must run on one event loop (the ``hf`` engine batches every
request in flight on that loop into each forward).  The server owns that loop in a daemon thread, so the
process that hosts the engine -- a hybrid actor worker, a standalone server actor, or the trainer itself
with ``trainer.backend=local`` -- can accept requests from anywhere:

* :meth:`submit` / :meth:`submit_many` from any thread, returning ``concurrent.futures.Future`` s;
* :meth:`stream` from a (Ray) thread: submit a list of requests and yield their outputs in completion
  order, grouped by what finished together (one Ray streaming call carries many requests);
* :meth:`call` runs a function on the loop thread, serialised with generation (e.g. ``sleep``).

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
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from hybridflow.rollout.base import EngineError, RolloutEngine, TokenOutput
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.rollout.service.watchdog import StallWatchdog
from hybridflow.utils.threads import settle

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
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-loop", daemon=True)
        self._thread.start()
        self._closed = False
        self._lock = threading.Lock()
        self._inflight: dict[int, concurrent.futures.Future] = {}
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

        self._loop.call_soon_threadsafe(start)
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
            return len(self._inflight), [what for _, what in self._calls.values()], self._finished, self._paused()

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

    def close(self) -> None:
        """Stop the loop thread; requests still in flight fail with an ``EngineError``."""
        if self._closed:
            return
        self._closed = True
        self.watchdog.stop()
        with self._lock:
            waiting = list(self._inflight.values()) + [f for f, _ in self._calls.values()]
        for future in waiting:
            settle(future, error=EngineError(f"rollout server '{self.name}' was closed while a request or call "
                                             "was in flight"))

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

