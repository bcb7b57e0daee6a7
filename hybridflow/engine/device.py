"""The one device abstraction: everything device-specific in the engine goes through here.

CPU and GPU code paths differ only in a handful of facts -- which device to put tensors on,
which torch.distributed backend to use (gloo vs NCCL), which dtype is fast (fp32 on a CPU
without AMX/AVX-512-BF16, where bf16 matmuls are ~100x slower; bf16 on GPUs), which attention
kernel to request, and how to query/free memory.  Keeping those facts in one module means the
FSDP engine, the workers and the rollout share every other line between CPU and GPU.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import torch

__all__ = [
    "device_type",
    "get_device",
    "dist_backend",
    "default_dtype",
    "resolve_dtype",
    "attn_implementation",
    "memory_stats",
    "synchronize",
    "empty_cache",
    "is_cuda",
]

_DTYPES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}


@lru_cache(maxsize=1)
def device_type() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"`` (``HYBRIDFLOW_DEVICE`` forces one)."""
    forced = os.environ.get("HYBRIDFLOW_DEVICE")
    if forced:
        if forced not in ("cpu", "cuda"):
            raise ValueError(f"HYBRIDFLOW_DEVICE must be 'cpu' or 'cuda', got {forced!r}")
        return forced
    return "cuda" if torch.cuda.is_available() else "cpu"


def is_cuda() -> bool:
    return device_type() == "cuda"


def get_device() -> torch.device:
    """The device this process computes on (the local GPU chosen by LOCAL_RANK, or the CPU)."""
    if is_cuda():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dist_backend() -> str:
    """torch.distributed backend for collectives between ranks: NCCL on GPU, gloo on CPU."""
    return "nccl" if is_cuda() else "gloo"


def default_dtype() -> torch.dtype:
    """Compute dtype used when the config does not say: bf16 on GPU, fp32 on CPU (see module doc)."""
    return torch.bfloat16 if is_cuda() else torch.float32


def resolve_dtype(name: str | torch.dtype | None, field: str = "dtype") -> torch.dtype:
    """Map a config string (``bf16``, ``bfloat16``, ``fp32``...) to a torch dtype.

    ``None`` or ``"auto"`` means "the device default".  On CPU a half-precision request is honoured but is
    almost never what the user wants, so the caller decides whether to downgrade it.
    """
    if name is None or str(name).lower() == "auto":
        return default_dtype()
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"{field}={name!r} is not a known dtype; use one of {sorted(set(_DTYPES))}") from None


def attn_implementation() -> str:
    """``flash_attention_2`` on GPU when the package is importable, else ``sdpa``.

    sdpa in transformers 5 also honours packed sequences (position ids restarting at 0 with no
    attention mask), which the padding-free forward in ``engine/forward.py`` relies on.
    """
    if is_cuda() and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


def memory_stats() -> dict[str, float]:
    """Memory in GiB: allocated/reserved/peak on GPU, resident set size of the process on CPU."""
    gib = float(1 << 30)
    if is_cuda():
        return {
            "memory_allocated_gb": torch.cuda.memory_allocated() / gib,
            "memory_reserved_gb": torch.cuda.memory_reserved() / gib,
            "max_memory_allocated_gb": torch.cuda.max_memory_allocated() / gib,
        }
    return {"cpu_rss_gb": _rss_bytes() / gib}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def synchronize() -> None:
    """Wait for queued device work (no-op on CPU, where ops are synchronous)."""
    if is_cuda():
        torch.cuda.synchronize()


def empty_cache() -> None:
    """Return cached device memory to the driver (no-op on CPU)."""
    if is_cuda():
        torch.cuda.empty_cache()
