"""What one trainer step records as it runs: the seconds of each stage and the metrics, in one object.

Every stage of a step -- the controller's, a mode's, a hook's -- writes here: ``log.timed("ref")`` adds the
seconds of the block to ``log.timing["ref"]`` (logged as ``timing_s/ref``), ``log.metrics`` takes the rest.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from hybridflow.utils.profiler import simple_timer

__all__ = ["StepLog"]


@dataclass
class StepLog:
    """Seconds per stage (``timing``) and metrics (``metrics``) of one step or one part of it."""

    timing: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to ``timing[name]``."""
        with simple_timer(name, self.timing):
            yield

    def update(self, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)
