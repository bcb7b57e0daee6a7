"""A weight version as a fact: a cheap digest of a model's weights that the engine and the trainer compute alike.

A counter says how many times weights were *sent*; a digest says which weights an engine *holds*.  The digest of a
set of named tensors hashes a few of them -- the first, two in between and the last of the sorted floating-point
names (an optimizer step changes them all), each by its first and last ``_SLICE`` elements -- in the dtype the
engine holds (the trainer's fp32 weights are cast first, as a load casts them).  The tensors are read as they are:
full tensors (an engine's copy, a module under ``full_params``) or a DTensor, whose sampled slices are gathered.

:func:`weights_digest` returns 16 hex characters; a ``None`` digest means "not verifiable here" (no tensor the two
sides share by name, e.g. a LoRA engine holding merged weights).
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Mapping

import torch

__all__ = ["digest_names", "weights_digest"]

_SLICE = 2048


def digest_names(names: Iterable[str]) -> list[str]:
    """The names a digest reads: first, one third, two thirds and last of the sorted names."""
    ordered = sorted(names)
    if not ordered:
        return []
    n = len(ordered)
    return [ordered[i] for i in sorted({0, n // 3, (2 * n) // 3, n - 1})]


def _slices(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    t = tensor.detach()
    if hasattr(t, "full_tensor"):  # a DTensor: the sampled tensor is gathered (all ranks call this together)
        t = t.full_tensor()
    flat = t.reshape(-1)
    part = flat if flat.numel() <= 2 * _SLICE else torch.cat([flat[:_SLICE], flat[-_SLICE:]])
    return part.to(device="cpu", dtype=dtype or part.dtype).float().contiguous()


def weights_digest(tensors: Mapping[str, torch.Tensor], names: Iterable[str] | None = None,
                   dtype: torch.dtype | None = None) -> str | None:
    """The digest of ``tensors`` (``name -> tensor``) over ``names`` (default :func:`digest_names` of the floating
    tensors), each cast to ``dtype`` first; ``None`` when a name is missing or nothing is left to read."""
    floating = [k for k, v in tensors.items() if torch.is_floating_point(v)]
    chosen = list(names) if names is not None else digest_names(floating)
    if not chosen or any(name not in tensors for name in chosen):
        return None
    h = hashlib.blake2b(digest_size=8)
    with torch.no_grad():
        for name in chosen:
            h.update(name.encode())
            h.update(_slices(tensors[name], dtype).numpy().tobytes())
    return h.hexdigest()
