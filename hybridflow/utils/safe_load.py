"""Read hybridflow's own ``.pt`` checkpoint files without running code from them, with errors that name the file.

``torch.load(weights_only=False)`` unpickles arbitrary objects, so a crafted ``.pt`` (a downloaded checkpoint,
a shared folder) runs its code on ``hybridflow merge`` or a resume. :func:`load_torch_file` always loads with
``weights_only=True``, allowing besides tensors and Python containers only what our checkpoints hold:

* numpy's RNG state (``np.random.get_state()``: an ``ndarray`` of ``uint32``), in the trainer and engine state;
* FSDP2 shards: ``DTensor`` with its spec, tensor meta, device mesh and placements (``Shard``/``Replicate``).

A file with anything else is refused with :class:`UnsafeCheckpointError` naming the file and the global it
wanted; a truncated, empty or non-torch file raises :class:`CorruptCheckpointError` naming the file.
"""

from __future__ import annotations

import functools
import importlib
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

_ALLOWED_NAMES = (
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.dtypes.UInt32DType", "numpy.dtypes.Int64DType", "numpy.dtypes.Float64DType",
    "torch.distributed.tensor.DTensor", "torch.distributed.tensor._dtensor_spec.DTensorSpec",
    "torch.distributed.tensor._dtensor_spec.TensorMeta", "torch.distributed.tensor._dtensor_spec.ShardOrderEntry",
    "torch.distributed.device_mesh.DeviceMesh", "torch.distributed.tensor.placement_types.Shard",
    "torch.distributed.tensor.placement_types.Replicate", "torch.distributed.tensor.placement_types._StridedShard",
)


class CheckpointFileError(RuntimeError):
    """A checkpoint file cannot be used; ``path`` is the file."""

    def __init__(self, message: str, path: str | Path):
        super().__init__(message)
        self.path = str(path)


class UnsafeCheckpointError(CheckpointFileError):
    """The file asks to build objects that hybridflow's checkpoints never contain (it could run code)."""


class CorruptCheckpointError(CheckpointFileError):
    """The file is truncated, empty or not a torch checkpoint."""


@functools.lru_cache(maxsize=1)
def allowed_globals() -> tuple[Any, ...]:
    """The classes/functions on the allow-list that exist in this torch/numpy."""
    found = []
    for dotted in _ALLOWED_NAMES:
        module, _, name = dotted.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _unsafe_global(message: str) -> str:
    match = re.search(r"GLOBAL ([\w.]+)", message)
    return match.group(1) if match else "an object that is not a tensor"


def load_torch_file(path: str | Path, map_location: Any = None) -> Any:
    """``torch.load(path, weights_only=True)`` with hybridflow's allow-list; errors name ``path``."""
    path = Path(path)
    if not path.is_file():
        raise CorruptCheckpointError(f"checkpoint file {path} does not exist", path)
    try:
        with torch.serialization.safe_globals(list(allowed_globals())):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        text = str(e)
        operand = re.search(r"Unsupported operand (\d+)", text)
        if operand and "GLOBAL" not in text:
            raise CorruptCheckpointError(
                f"checkpoint file {path} ({path.stat().st_size} bytes) is truncated or not a torch checkpoint "
                f"(pickle opcode {operand.group(1)} does not occur in one: a raw pickle or another format); "
                "nothing in it was run", path) from None
        if "Weights only load failed" in text or "GLOBAL" in text:
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it asks to build {_unsafe_global(text)}, which hybridflow's checkpoints "
                "never contain, so loading it could run code from the file. Use only checkpoints written by "
                "hybridflow; if you made this file yourself and trust it, convert it to plain tensors first",
                path) from None
        raise CorruptCheckpointError(f"checkpoint file {path} is corrupt ({text[:200]})", path) from None
    except (EOFError, RuntimeError, KeyError, ValueError, zipfile.BadZipFile, OSError) as e:
        size = path.stat().st_size if path.exists() else 0
        detail = str(e).split(". ", 1)[0][:200] or type(e).__name__
        if isinstance(e, RuntimeError) and not re.search(r"zip|PytorchStreamReader|archive|storage|magic", str(e)):
            raise CheckpointFileError(f"cannot load checkpoint file {path}: {detail}", path) from e
        raise CorruptCheckpointError(
            f"checkpoint file {path} ({size} bytes) is truncated or not a torch checkpoint ({detail})", path) from None


__all__ = ["CheckpointFileError", "CorruptCheckpointError", "UnsafeCheckpointError", "allowed_globals",
           "load_torch_file"]
