"""The generation watchdog: a replica that holds requests but makes no progress fails them, by name.

A hung forward (a deadlocked collective, a GPU that stopped answering, an engine thread that died without a
word) used to leave every trajectory waiting forever at 0% GPU -- the most reported hang of RL frameworks.
:class:`StallWatchdog` runs in a daemon thread beside one :class:`~hybridflow.rollout.service.server.RolloutServer`
and, every few seconds, compares a progress signature -- the engine's forward counter
(:meth:`~hybridflow.rollout.base.RolloutEngine.progress`) and the number of requests and control calls that
finished -- with the last one.  When the server has had work (requests in flight, or a control call such as a
weight load under way) and the signature has not moved for ``actor_rollout_ref.rollout.stall_timeout_s``
seconds, it hands a :class:`GenerationStalled` error to the server, which fails everything it holds and
refuses new work.  The message names the replica, the requests it held, what the engine was doing (prefill,
decode, weights...) and the stacks of the threads running hybridflow code at that moment.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Callable

from hybridflow.rollout.base import EngineError

__all__ = ["GenerationStalled", "StallWatchdog", "STALL_TIMEOUT_KEY", "thread_stacks"]

STALL_TIMEOUT_KEY = "actor_rollout_ref.rollout.stall_timeout_s"
_MAX_STACK_LINES = 60
# threads whose innermost hybridflow frame is one of these only wait for others: not worth showing
_WAITERS = {("server.py", "stream"), ("threads.py", "_work"), ("watchdog.py", "_run"), ("server_watch.py", "_run")}


class GenerationStalled(EngineError):
    """A replica made no progress with work in flight for ``stall_timeout_s`` (see the module docstring)."""


def thread_stacks(skip: set[int] = frozenset()) -> str:
    """Stacks of this process's threads that are inside hybridflow code (innermost frames last); the main
    thread (the caller, waiting) only when no other thread is."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    parts: dict[int, str] = {}
    for ident, frame in sys._current_frames().items():
        if ident in skip:
            continue
        stack = traceback.extract_stack(frame)
        ours = [f for f in stack if "/hybridflow/" in f.filename]
        if not ours or (ours[-1].filename.rsplit("/", 1)[-1], ours[-1].name) in _WAITERS:
            continue
        lines = "".join(traceback.format_list(stack)).rstrip().splitlines()[-_MAX_STACK_LINES:]
        parts[ident] = f"thread '{names.get(ident, ident)}':\n" + "\n".join(lines)
    if len(parts) > 1:
        parts.pop(main, None)
    return "\n".join(parts.values()) or "(no thread is inside hybridflow code)"


class StallWatchdog:
    """Watches one server (see the module docstring); ``timeout_s <= 0`` disables it.

    ``state()`` returns ``(requests in flight, control calls under way, finished count, paused)``;
    ``progress()`` the engine's ``(counter, doing)``; ``on_stall(error)`` fails the server's work.
    """

    def __init__(self, name: str, timeout_s: float, state: Callable[[], tuple[int, list[str], int, bool]],
                 progress: Callable[[], tuple[int, str]], on_stall: Callable[[GenerationStalled], None]):
        self.name = name
        self.timeout_s = float(timeout_s)
        self._state = state
        self._progress = progress
        self._on_stall = on_stall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._signature: tuple | None = None
        self._since = time.monotonic()
        self.fired: GenerationStalled | None = None

    @property
    def interval_s(self) -> float:
        return min(max(self.timeout_s / 8, 0.02), 5.0)

    def start(self) -> "StallWatchdog":
        if self.timeout_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{self.name}-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            error = self.check(time.monotonic())
            if error is not None:
                self.fired = error
                self._on_stall(error)
                return

    def check(self, now: float) -> GenerationStalled | None:
        """One look; the error to raise when the server has been stuck for ``timeout_s``."""
        inflight, calls, finished, paused = self._state()
        counter, doing = self._progress()
        signature = (counter, finished)
        busy = bool(calls) or (inflight > 0 and not paused)
        if not busy or signature != self._signature:
            self._signature, self._since = signature, now
            return None
        stalled = now - self._since
        if stalled < self.timeout_s:
            return None
        work = [f"{inflight} request(s) in flight"] + [f"a '{c}' call under way" for c in calls]
        if inflight and doing == "idle" and not calls:
            doing = "idle: no engine step is running although requests wait (its driver stopped)"
        own = {threading.get_ident()}
        return GenerationStalled(
            f"rollout replica '{self.name}' made no progress for {stalled:.1f} s with {', '.join(work)}; the engine "
            f"was doing: {doing}.  A forward, a collective or a weight load is hung (or the engine thread died); "
            f"every request it held fails with this error.  If steps legitimately take this long, raise "
            f"{STALL_TIMEOUT_KEY}={self.timeout_s:g} (0 disables the watchdog).\n"
            f"--- threads in hybridflow code ---\n{thread_stacks(own)}")
