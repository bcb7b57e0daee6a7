"""The AMX tile permission vLLM's CPU kernels need, asked for in the process that runs them.

vLLM-CPU's paged attention (``torch.ops._C.cpu_attention_with_kv_cache``) picks its ``amx`` kernel for bfloat16
on processors with AMX tiles (``vllm/v1/attention/backends/cpu_attn.py``: ``_get_attn_isa``). Linux lets a
process execute AMX tile instructions only after it asked for the permission (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``); without it the first tile instruction is an illegal instruction and the process dies
(``Fatal Python error: Illegal instruction`` inside ``GOMP_parallel``, the kernel's OpenMP region). oneDNN asks for
it when it first runs a bf16 matmul with AMX, and vLLM does not: whether a bf16 rollout survived depended on
whether some oneDNN matmul had run in the process first (a LoRA rollout, whose first sync moves only the adapter,
reached the attention kernel before any). ``torch.cpu._init_amx()`` makes the request; it is asked for before an
engine is built here and in every vLLM worker process hybridflow starts (the worker extension imports this
module).
"""

from __future__ import annotations

__all__ = ["request_amx_tiles"]


def request_amx_tiles() -> bool:
    """Ask the kernel for the AMX tile permission where the CPU has AMX; True when it is granted (or not needed)."""
    import torch

    try:
        if not torch.cpu._is_amx_tile_supported():
            return True
        return bool(torch.cpu._init_amx())
    except (AttributeError, RuntimeError):  # a torch without these helpers: nothing to ask for
        return True
