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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from hybridflow.rollout.base import RolloutEngine, TokenOutput
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["GenerateRequest", "RolloutServer"]


@dataclass(frozen=True)
class GenerateRequest:
    """One token-in/token-out request as it travels from a replica client to a server."""

    request_id: str
    prompt_ids: list[int]
    sampling_params: SamplingParams
    multi_modal_data: dict[str, Any] | None = None


class RolloutServer:
    """Hosts ``engine`` on a private event loop in a daemon thread; thread-safe front door."""

    def __init__(self, engine: RolloutEngine, name: str = "rollout"):
        self.engine = engine
        self.name = name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{name}-loop", daemon=True)
        self._thread.start()
        self._closed = False

    # ------------------------------------------------------------------ requests
    def submit(self, request: GenerateRequest) -> concurrent.futures.Future:
        """Start one request; the future holds its ``TokenOutput`` (or the engine's exception)."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[GenerateRequest]) -> list[concurrent.futures.Future]:
        """Start several requests in one loop callback (they join the engine's next step together)."""
        self._check_open()
        futures = [concurrent.futures.Future() for _ in requests]

        def start() -> None:
            for request, future in zip(requests, futures):
                task = self._loop.create_task(self._generate(request))
                task.add_done_callback(lambda t, f=future: _copy_result(t, f))

        self._loop.call_soon_threadsafe(start)
        return futures

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
    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn()`` on the loop thread (between engine steps) and return its result."""
        self._check_open()

        async def run():
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def close(self) -> None:
        """Stop the loop thread; requests still in flight fail with ``RuntimeError``."""
        if self._closed:
            return
        self._closed = True

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


def _copy_result(task: asyncio.Task, future: concurrent.futures.Future) -> None:
    if task.cancelled():
        future.set_exception(RuntimeError("the rollout server was closed while the request was in flight"))
    elif task.exception() is not None:
        future.set_exception(task.exception())
    else:
        future.set_result(task.result())
