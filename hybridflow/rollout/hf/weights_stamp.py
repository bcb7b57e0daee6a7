"""A cheap fingerprint of a model's weights, to tell when they changed under cached state.

Parked prefixes (:mod:`~hybridflow.rollout.hf.prefix_pool`) and the fast decoder's packed weight copies were
computed from the weights of their time.  The engine's hooks (update_weights, sleep, wake_up) drop them
explicitly; the stamp catches a weight change that bypassed those hooks.
"""

from __future__ import annotations

import torch

__all__ = ["WeightsStamp"]

_PLAIN = (torch.nn.Parameter, torch.Tensor)


def _stamp_params(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(module, attribute) of the first, a middle and the last trainable parameter (all parameters when
    none is trainable), read afresh at every stamp: FSDP swaps the tensors behind the same attributes."""
    named = [(m, n, p) for m in model.modules() for n, p in m.named_parameters(recurse=False)]
    pool = [x for x in named if x[2].requires_grad] or named
    return [(pool[i][0], pool[i][1]) for i in sorted({0, len(pool) // 2, len(pool) - 1})]


class WeightsStamp:
    """``value()`` changes when the weights change: storage and version counter (bumped by every in-place
    update: optimizer step, load) of the first, a middle and the last trainable parameter -- an optimizer step
    updates them all -- plus a few of their values (fused optimizer kernels do not bump version counters).
    Computed at most once between two :meth:`new_step` calls."""

    def __init__(self, model: torch.nn.Module):
        self._params = _stamp_params(model)
        self._value: int | None = None

    def new_step(self) -> None:
        self._value = None

    def value(self) -> int:
        if self._value is None:
            params = [getattr(module, name) for module, name in self._params]
            params = [getattr(p, "_local_tensor", p) if type(p) not in _PLAIN else p for p in params]  # DTensor
            probe = [v for p in params for v in p.detach().reshape(-1)[:2].tolist()]
            self._value = hash((tuple((p.data_ptr(), p._version) for p in params), tuple(probe)))
        return self._value
