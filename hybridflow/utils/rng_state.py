"""The random streams of this process as one dict, captured and restored: what makes a resume exact.

:func:`capture_rng_state` returns ``{"python": ..., "numpy": ..., "torch": <CPU generator>}`` plus, when this
process has an accelerator whose runtime it has started, that accelerator's generators under its device type
(``"cuda"``, ``"xpu"``, ...): one state per visible device.  Capturing never starts an accelerator's runtime (the
controller process must not take a GPU context just to save a checkpoint).

:func:`restore_rng_state` puts every stream back.  Accelerator states saved on a device type this process does not
have are left alone (a GPU run's checkpoint resumed on CPU), and states for more devices than this process sees
are cut to the ones it sees.  A single state tensor instead of a list -- what the engine checkpoints held before
this module, the current CUDA device's generator -- restores the current device.

The trainer's ``trainer_state.pt`` (``trainer/run_checkpoint.py``) and each engine rank's
``extra_state_world_size_W_rank_R.pt`` (``engine/engine_checkpoint.py``) both store this dict.
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import numpy as np
import torch

__all__ = ["capture_rng_state", "restore_rng_state"]

_HOST_STREAMS = ("python", "numpy", "torch")


def _accelerator() -> tuple[str, ModuleType] | None:
    """(device type, its torch module) of this process's accelerator, ``None`` on a CPU-only machine."""
    found = torch.accelerator.current_accelerator()
    return None if found is None else (found.type, torch.get_device_module(found.type))


def _device_states(module: ModuleType) -> list[torch.Tensor]:
    if hasattr(module, "get_rng_state_all"):
        return list(module.get_rng_state_all())
    return [module.get_rng_state()]


def _set_device_states(module: ModuleType, saved: torch.Tensor | list[torch.Tensor]) -> None:
    if isinstance(saved, torch.Tensor):  # one device's state: the current device
        module.set_rng_state(saved)
    elif hasattr(module, "set_rng_state_all"):
        count = module.device_count() if hasattr(module, "device_count") else len(saved)
        module.set_rng_state_all(list(saved)[:count])
    elif saved:
        module.set_rng_state(saved[0])


def capture_rng_state() -> dict[str, Any]:
    """The state of python's, numpy's and torch's generators, and of the accelerator's when it is in use."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    accelerator = _accelerator()
    if accelerator is not None:
        kind, module = accelerator
        started = getattr(module, "is_initialized", lambda: True)()
        if started:
            state[kind] = _device_states(module)
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what :func:`capture_rng_state` returned (see the module docstring for other machines' states)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    accelerator = _accelerator()
    if accelerator is not None and state.get(accelerator[0]) is not None:
        _set_device_states(accelerator[1], state[accelerator[0]])
