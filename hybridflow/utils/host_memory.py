"""Host memory between training steps: let the C heap keep freed tensor memory for the next micro-batch.

By default glibc serves a block over a threshold (128 KiB, raised as blocks are freed, up to 32 MiB) with a fresh
``mmap`` and unmaps it on ``free``, and gives the heap's top back when more than twice that threshold is free.  A
training step on CPU allocates and frees the same activations every micro-batch, so each step faulted its pages in
again: ~3,000 page faults per step on the 1M-parameter step shape of ``benchmarks/bench_vs_trl.py``, 4 with
:func:`keep_freed_host_memory` (about 5 % of that step).  Blocks up to 32 MiB (glibc's ceiling) then come from the
heap, and up to 256 MiB of free heap stays mapped (glibc still gives back what is beyond that).  The rollout's
KV cache freed before the update is reused by it in the same process.  ``HYBRIDFLOW_MALLOC_TUNING=0`` keeps glibc's
defaults; on other C libraries (musl, macOS) nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

__all__ = ["ENV_MALLOC_TUNING", "keep_freed_host_memory"]

ENV_MALLOC_TUNING = "HYBRIDFLOW_MALLOC_TUNING"
# glibc's mallopt parameters (malloc.h) and the values set
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 256 << 20


@lru_cache(maxsize=1)
def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version, libc.mallopt  # noqa: B018 - glibc's own symbols
    except (OSError, AttributeError):
        return None
    return libc


@lru_cache(maxsize=1)
def keep_freed_host_memory() -> bool:
    """Set the two thresholds once per process; returns whether the tuning is on."""
    if os.environ.get(ENV_MALLOC_TUNING, "1").strip() == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))

