"""verl's ``verl.utils.rollout_trace`` names, so agent-loop files that decorate their methods import unchanged.

verl records the inputs and outputs of decorated calls to Weave or MLflow when
``actor_rollout_ref.rollout.trace.backend`` names one; hybridflow has no trace backend (the run's
``rollout_data_dir`` / ``validation_data_dir`` dumps and the report hold the trajectories), so the
decorator and the context manager leave the call unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

__all__ = ["rollout_trace_op", "rollout_trace_attr"]


def rollout_trace_op(fn: Callable) -> Callable:
    """Decorator of traced agent-loop methods: returns ``fn`` itself."""
    return fn


@contextlib.contextmanager
def rollout_trace_attr(**attributes: Any) -> Iterator[None]:
    """Context of one traced trajectory (step, sample index, ...): nothing to record here."""
    yield
