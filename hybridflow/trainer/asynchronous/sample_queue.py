"""The bounded queue between the fully async rollouter (producer thread) and the trainer (consumer).

It holds every *outstanding* sample -- started by the rollouter and not yet trained on -- in flight or
finished, so the trainer can keep the staleness bound:

* finished samples are handed out oldest weight version first (then in finishing order), so samples left
  over from a previous version go before fresh ones;
* a sample is *due* at trainer version ``v`` when ``param_version_start <= v - max_staleness``: training on
  it any later would exceed the bound.  :meth:`SampleQueue.take` waits for in-flight due samples (partial
  rollouts continued across weight syncs) when the rest of the version has no room left for them.

A finished sample is handed to ``on_finished`` (the rollout log, ``trainer/durable/``), which makes it visible to
the trainer once it is on disk; :meth:`SampleQueue.restore` puts samples a crashed run had finished back as finished, and
:meth:`SampleQueue.take_exact` hands out named samples (a resumed run replaying the steps it had taken).

Nothing is ever dropped: the rollouter's budget (``(1 + staleness_threshold) x`` the samples of one version)
bounds the queue, so a put never blocks.  A rollouter failure is handed to the trainer's next
:meth:`take` as :class:`RolloutFailed`.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hybridflow.protocol import DataProto

__all__ = ["Sample", "SampleQueue", "RolloutFailed"]


class RolloutFailed(RuntimeError):
    """The rollouter stopped with an error (a replica died, an agent-loop worker crashed)."""


@dataclass
class Sample:
    """One prompt of the stream and, once finished, its ``rollout.n`` trajectories."""

    ordinal: int
    prompt: DataProto  # one row: the controller's copy (uid, reward_model, data_source, ...)
    version_start: int = -1
    version_end: int = -1
    outputs: list[Any] = field(default_factory=list)  # AgentLoopOutput per trajectory
    trajectory_metrics: list[dict[str, float]] = field(default_factory=list)
    submit_step: int = 0  # V1: the trainer step that submitted the prompt (verl's prompt ``global_steps`` tag)
    filtered: bool | None = None  # V1 with DAPO filtering: classified once, when first seen finished
    rows: DataProto | None = None  # V1 sync: the group's generated and scored rows

    @property
    def failed(self) -> bool:
        """A trajectory of the group failed (its agent loop raised): verl's ``failure`` status."""
        if self.rows is not None:
            errors = self.rows.non_tensor_batch.get("agent_error")
            return errors is not None and any(e is not None for e in errors)
        return any((getattr(o, "extra_fields", None) or {}).get("agent_error") is not None for o in self.outputs)


class SampleQueue:
    """Outstanding samples of a fully async run (see the module docstring); thread-safe."""

    def __init__(self):
        self._cond = threading.Condition()
        self._in_flight: dict[int, Sample] = {}
        self._finished: list[tuple[int, int, Sample]] = []  # (version_start, finish order, sample)
        self._order = itertools.count()
        self._done = False
        self._error: BaseException | None = None
        self.wait_seconds = 0.0  # time the trainer spent waiting in take()
        # the rollout log: on_finished(sample, publish) writes the sample, then publish(sample) makes it visible
        self.on_finished: Callable[[Sample, Callable[[Sample], None]], None] | None = None

    def restore(self, samples: Iterable[Sample]) -> None:
        """Samples a crashed run had finished (read back from the rollout log), outstanding and finished again."""
        with self._cond:
            for sample in sorted(samples, key=lambda s: s.ordinal):
                self._finished.append((sample.version_start, next(self._order), sample))
            self._cond.notify_all()

    # ------------------------------------------------------------------ producer
    def started(self, sample: Sample) -> None:
        with self._cond:
            self._in_flight[sample.ordinal] = sample

    def finished(self, sample: Sample) -> None:
        if self.on_finished is not None:  # write-ahead: on disk before the trainer can take it (it publishes)
            self.on_finished(sample, self._publish)
            return
        self._publish(sample)

    def _publish(self, sample: Sample) -> None:
        with self._cond:
            self._in_flight.pop(sample.ordinal, None)
            self._finished.append((sample.version_start, next(self._order), sample))
            self._cond.notify_all()

    def close(self) -> None:
        """No more samples will start (the stream ended)."""
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    # ------------------------------------------------------------------ consumer
    def size(self) -> int:
        """Finished samples waiting for the trainer."""
        with self._cond:
            return len(self._finished)

    def outstanding(self) -> int:
        with self._cond:
            return len(self._finished) + len(self._in_flight)

    def pending(self) -> list[int]:
        """Ordinals of the outstanding samples (in flight or finished, not taken)."""
        with self._cond:
            return sorted([*self._in_flight, *(s.ordinal for _, _, s in self._finished)])

    def take(self, k: int, due_version: int | None = None, room_after: int = 0,
             timeout: float | None = None) -> list[Sample] | None:
        """``k`` finished samples, oldest weight version first; ``None`` when the stream ended with fewer.

        ``due_version``: samples started at this weight version or earlier are due; those that the rest of
        the version (``room_after`` samples after this take) cannot hold must be in this take, so the call
        waits for them if they are still in flight.
        """
        start = time.perf_counter()
        with self._cond:
            try:
                while True:
                    if self._error is not None:
                        raise RolloutFailed(f"the rollouter stopped: {self._error}") from self._error
                    if self._ready(k, due_version, room_after):
                        break
                    if self._done and not self._in_flight:
                        return None  # the stream ended without enough samples for another step
                    if not self._cond.wait(timeout=timeout if timeout is not None else 1.0) and timeout is not None:
                        raise TimeoutError(f"no {k} samples after {timeout:.0f}s")
                self._finished.sort(key=lambda item: (item[0], item[1]))
                taken, self._finished = self._finished[:k], self._finished[k:]
                return [sample for _, _, sample in taken]
            finally:
                self.wait_seconds += time.perf_counter() - start

    def take_exact(self, ordinals: list[int], timeout: float = 3600.0) -> list[Sample]:
        """The finished samples ``ordinals`` (in that order), waiting at most ``timeout`` seconds for them."""
        wanted = set(int(o) for o in ordinals)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise RolloutFailed(f"the rollouter stopped: {self._error}") from self._error
                have = {s.ordinal for _, _, s in self._finished if s.ordinal in wanted}
                if have == wanted:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"samples {sorted(wanted - have)} to replay did not finish within {timeout:.0f}s")
                self._cond.wait(timeout=min(left, 1.0))
            by_ordinal = {s.ordinal: s for _, _, s in self._finished if s.ordinal in wanted}
            self._finished = [item for item in self._finished if item[2].ordinal not in wanted]
            return [by_ordinal[int(o)] for o in ordinals]

    def _ready(self, k: int, due_version: int | None, room_after: int) -> bool:
        if len(self._finished) < k:
            return False
        if due_version is None:
            return True
        finished_due = sum(1 for v, _, _ in self._finished if v <= due_version)
        flying_due = sum(1 for s in self._in_flight.values() if s.version_start <= due_version)
        must_take = min(k, max(0, finished_due + flying_due - room_after))
        return finished_due >= must_take
