"""Validation off the critical path (``trainer.async_validation=true``): the held-out set is answered on its own
thread, against the weights of a named step, while training goes on; its metrics are logged at that step.

When validation is due after step ``N`` the controller :meth:`~BackgroundValidation.submit`\\ s it and goes on to
step ``N+1`` at once. Validation generates on the rollout replicas *between* the training requests (its own
agent-loop manager over the same fleet, ``modes/validation_rollout.py``), so the replicas must keep step ``N``'s
weights until it is done: the mode calls :func:`before_push` right before its next weight push, which waits for
the validation still running (``timing_s/testing_wait``: what training did wait; with the push one trainer version
later this is usually nothing). One validation runs at a time; a second one due first waits for the first.

Modes whose replicas keep their weights across steps (``fully_async`` and V1 ``separate_async``) can do this;
the others generate with the actor's own weights or push them before every batch, so the key is refused there at
config time (``config/modes.py``). ``trainer.async_validation=false`` (the default) is today's synchronous
validation, unchanged.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run
    from hybridflow.trainer.step_log import StepLog

__all__ = ["BackgroundValidation", "ValidationDone", "before_push"]

WAIT_S = 4 * 3600.0  # a validation that runs longer than this is stuck: the run stops naming it


@dataclass
class ValidationDone:
    step: int  # the step whose weights it used
    metrics: dict[str, float]
    samples: list[dict[str, Any]]
    seconds: float


class BackgroundValidation:
    """Runs ``validate(step) -> (metrics, samples)`` on a thread of its own (see the module docstring)."""

    def __init__(self, validate: Callable[[int], tuple[dict[str, float], list[dict[str, Any]]]]):
        self.validate = validate
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation")
        self._running: tuple[int, concurrent.futures.Future, float] | None = None
        self._done: list[ValidationDone] = []
        self.waited_s = 0.0  # what training waited for validation, all told
        self.ran_s = 0.0  # what the validations took, all told

    def submit(self, step: int) -> float:
        """Start validating the weights of ``step``; returns the seconds spent waiting for the previous one."""
        waited = self.wait()
        start = time.perf_counter()
        self._running = (int(step), self._executor.submit(self.validate, int(step)), start)
        return waited

    def wait(self) -> float:
        """Wait for the validation running (if any); its result is kept for :meth:`finished`."""
        if self._running is None:
            return 0.0
        step, future, started = self._running
        start = time.perf_counter()
        try:
            metrics, samples = future.result(timeout=WAIT_S)
        except concurrent.futures.TimeoutError:
            raise RuntimeError(f"the background validation of step {step}'s weights did not finish within "
                               f"{WAIT_S:.0f}s; set trainer.async_validation=false to validate in line") from None
        finally:
            self._running = None if future.done() else self._running
        waited = time.perf_counter() - start
        seconds = time.perf_counter() - started
        self.waited_s += waited
        self.ran_s += seconds
        self._done.append(ValidationDone(step, metrics, samples, seconds))
        return waited

    def finished(self) -> list[ValidationDone]:
        """Validations finished since the last call (a running one that has finished included)."""
        if self._running is not None and self._running[1].done():
            self.wait()
        done, self._done = self._done, []
        return done

    def close(self) -> list[ValidationDone]:
        """Wait for the last validation; returns what finished."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=False)
        return self.finished()

    def close_now(self) -> None:
        """The run stopped: let the validation thread end with its aborted requests, without waiting for it."""
        self._running = None
        self._executor.shutdown(wait=False, cancel_futures=True)


def before_push(run: Run, log: StepLog, pushes: bool = True) -> None:
    """Called by a mode right before it (``pushes``: may) push new weights to replicas a background validation may
    be using: wait for that validation."""
    background = getattr(run, "background_validation", None)
    if background is not None and pushes:
        with log.timed("testing_wait"):
            background.wait()
