"""verl's ``verl.utils.profiler.simple_timer``: time a block into a dict of seconds (agent loops use it)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["simple_timer"]


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to ``timing_raw[name]`` (the trainer logs them as ``timing_s/<name>``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start
