"""A process-wide stop request, and waits on user code that give up a step when it cannot finish.

The first SIGINT / SIGTERM asks the trainer to finish the step under way, save and exit
(:mod:`hybridflow.trainer.signals` calls :func:`request_stop`).  A step that waits on a user's reward
function or tool that is stuck would then only end at that call's own timeout -- for in-process scoring,
``reward_model.timeout_s`` per sample, one sample after the other.  Waits on user code therefore go through
:func:`wait_future` / :func:`wait_awaitable`: once a stop is requested, such a wait lasts at most
:data:`STOP_GRACE_S` more seconds, after which it raises :class:`StepAbandoned` (a ``KeyboardInterrupt``,
what a second signal raises): the step is given up, the last complete checkpoint stays the latest, and the
run exits with the signal's code within seconds.  Without a stop request these waits behave as plain waits
with their timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Awaitable

__all__ = ["STOP_GRACE_S", "StepAbandoned", "request_stop", "clear_stop", "stop_requested", "check_stop",
           "wait_future", "wait_awaitable"]

STOP_GRACE_S = 5.0
_POLL_S = 0.25
_lock = threading.Lock()
_requested_at: float | None = None


class StepAbandoned(KeyboardInterrupt):
    """A stop was requested and user code did not answer within :data:`STOP_GRACE_S`: the step is abandoned."""


def request_stop() -> None:
    """Record a stop request (the first one counts)."""
    global _requested_at
    with _lock:
        if _requested_at is None:
            _requested_at = time.monotonic()


def clear_stop() -> None:
    global _requested_at
    with _lock:
        _requested_at = None


def stop_requested() -> bool:
    return _requested_at is not None


def check_stop(what: str) -> None:
    """Raise :class:`StepAbandoned` when a stop was requested more than :data:`STOP_GRACE_S` ago."""
    requested = _requested_at
    if requested is not None and time.monotonic() - requested >= STOP_GRACE_S:
        raise StepAbandoned(f"a stop was requested {time.monotonic() - requested:.1f} s ago and {what} has not "
                            "answered: abandoning the current step (the last complete checkpoint is kept)")


def wait_future(future: concurrent.futures.Future, timeout_s: float | None, what: str) -> Any:
    """``future.result(timeout_s)``, given up with :class:`StepAbandoned` after a stop request (see the module
    docstring); raises ``concurrent.futures.TimeoutError`` after ``timeout_s`` as ``result`` does."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = None if end is None else end - time.monotonic()
        try:
            return future.result(_POLL_S if left is None else max(0.0, min(_POLL_S, left)))
        except concurrent.futures.TimeoutError:
            if left is not None and left <= _POLL_S:
                raise
        check_stop(what)


async def wait_awaitable(awaitable: Awaitable, timeout_s: float | None, what: str) -> Any:
    """``asyncio.wait_for(awaitable, timeout_s)``, given up with :class:`StepAbandoned` after a stop request."""
    task = asyncio.ensure_future(awaitable)
    end = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise asyncio.TimeoutError(f"{what} did not answer within {timeout_s:g} s")
            done, _ = await asyncio.wait({task}, timeout=_POLL_S if left is None else min(_POLL_S, left))
            if done:
                return task.result()
            check_stop(what)
    finally:
        if not task.done():
            task.cancel()
