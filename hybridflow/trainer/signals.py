"""Graceful SIGINT / SIGTERM: finish (or abandon) the current step, save, write the report, exit 130 / 143.

A scheduler's SIGTERM (preemption, ``scancel``, ``kubectl delete``) or a user's Ctrl-C must not lose the
work since the last ``save_freq`` step nor leave a half-written checkpoint. The trainer already treats a
``should_stop()`` that returns ``True`` as "this step is the last one": it validates, saves a checkpoint
(when ``save_freq > 0``) and writes the report. So the handler here only records the signal; the first
signal lets the running step finish, a second one raises ``KeyboardInterrupt`` to abandon the step at once
(checkpoint writes are atomic, so an abandoned save leaves the previous checkpoint as the latest).

A step stuck on user code cannot finish: after the first signal, a wait on a reward function or a tool that
has not answered within :data:`~hybridflow.utils.stopping.STOP_GRACE_S` seconds abandons the step as a second
signal would (:mod:`hybridflow.utils.stopping`), so one SIGTERM ends such a run within seconds too.  Every
thread that can be stuck in user or engine code is a daemon thread, so nothing keeps the process from exiting.

Exit codes follow the shell convention ``128 + signal number``: 130 for SIGINT, 143 for SIGTERM, so a job
script can tell "interrupted, resumable" from "failed" (1) and "bad config" (2).

Usage (the CLI's train command)::

    with GracefulInterrupt() as interrupt:
        train_ppo(cfg, should_stop=interrupt.should_stop)
    return interrupt.exit_code          # 0 when no signal arrived
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Callable

from hybridflow.utils import stopping

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code_for(signum: int) -> int:
    """``128 + signum``: 130 for SIGINT, 143 for SIGTERM (what a shell reports for a signalled process)."""
    return 128 + int(signum)


class GracefulInterrupt:
    """Context manager that turns SIGINT/SIGTERM into a stop request, restoring the old handlers on exit.

    ``should_stop`` is the callable the trainer polls after every step; ``combine(other)`` also stops when
    ``other()`` says so (e.g. a wall-clock budget). Handlers can only be installed from the main thread;
    elsewhere the object is inert (``should_stop`` is always ``False``), which keeps library use safe.
    """

    def __init__(self, stream=None):
        self.signum: int | None = None
        self._count = 0
        self._previous: dict[int, object] = {}
        self._stream = stream if stream is not None else sys.stderr

    # ------------------------------------------------------------------------------------- context
    def __enter__(self) -> "GracefulInterrupt":
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        stopping.clear_stop()
        # A second signal (or user code still stuck after the first, StepAbandoned) abandons the step with a
        # KeyboardInterrupt: that is the interrupt we asked for, not a crash, so swallow it and let
        # ``exit_code`` speak.
        ours = exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and self.signum is not None
        if ours and isinstance(exc, stopping.StepAbandoned):
            print(f"hybridflow: {exc}", file=self._stream, flush=True)
        return ours

    # ------------------------------------------------------------------------------------- state
    @property
    def interrupted(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.signum) if self.signum is not None else 0

    def should_stop(self) -> bool:
        return self.signum is not None

    def combine(self, other: Callable[[], bool] | None) -> Callable[[], bool]:
        """A ``should_stop`` that is true on a signal or when ``other()`` is (``other`` may be ``None``)."""
        if other is None:
            return self.should_stop
        return lambda: self.should_stop() or bool(other())

    # ------------------------------------------------------------------------------------- handler
    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002 - signal API
        self._count += 1
        if self.signum is None:
            self.signum = signum
        name = signal.Signals(signum).name
        if self._count == 1:
            stopping.request_stop()
            print(f"hybridflow: {name} received: finishing the current step, then saving (if trainer.save_freq > 0) "
                  "and writing the report; send it again to stop immediately", file=self._stream, flush=True)
            return
        print(f"hybridflow: second {name}: abandoning the current step (the last complete checkpoint is kept)",
              file=self._stream, flush=True)
        raise KeyboardInterrupt


__all__ = ["GracefulInterrupt", "exit_code_for", "HANDLED_SIGNALS"]
