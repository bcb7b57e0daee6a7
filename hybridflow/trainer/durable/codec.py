"""A JSON form of what the rollout log keeps: tensors, numpy arrays, batches, trajectories and samples.

The rollout log (``durable/wal.py``) must read back without running code from the file (no pickle: a checkpoint
folder may be shared), so every value is written as plain JSON with a few tagged objects:

* ``{"__t": dtype, "s": shape, "d": [...]}`` a torch tensor, ``{"__n": ...}`` a numeric numpy array,
  ``{"__o": [...], "s": shape}`` a numpy object array, ``{"__m": {...}}`` a dict (string keys), ``{"__tu": [...]}``
  a tuple, ``{"__dp": ...}`` a :class:`DataProto`, ``{"__alo": ...}`` an agent loop's trajectory.

Floats go through ``repr`` (exact for float64; float32 values widen exactly), so log-probs read back bit for bit.
A value of any other type raises :class:`Unencodable`: the caller leaves that sample out of the log (it is
generated again after a crash, as without the log).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.agents.base import AgentLoopOutput
from hybridflow.protocol import DataProto
from hybridflow.trainer.asynchronous.sample_queue import Sample

__all__ = ["Unencodable", "decode", "encode", "decode_sample", "encode_sample"]

_TORCH_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                     torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}


class Unencodable(TypeError):
    """A value the rollout log cannot write as JSON (images, user objects)."""


def encode(value: Any) -> Any:
    """``value`` as JSON-ready data (see the module docstring); :class:`Unencodable` for anything else."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return encode(value.item())
    if isinstance(value, torch.Tensor):
        return _encode_tensor(value)
    if isinstance(value, np.ndarray):
        return _encode_array(value)
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"__tu": [encode(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise Unencodable("a dict with non-string keys")
        return {"__m": {k: encode(v) for k, v in value.items()}}
    if isinstance(value, DataProto):
        return {"__dp": {"batch": {k: _encode_tensor(v) for k, v in value.batch.items()},
                         "non_tensor": {k: _encode_array(v) for k, v in value.non_tensor_batch.items()},
                         "meta": encode(value.meta_info)}}
    if isinstance(value, AgentLoopOutput):
        return {"__alo": encode(value.model_dump(exclude_unset=True))}
    raise Unencodable(f"a {type(value).__module__}.{type(value).__name__}")


def _encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    if str(t.dtype) not in _TORCH_DTYPES:
        raise Unencodable(f"a tensor of {t.dtype}")
    flat = t.detach().to("cpu")
    if t.dtype == torch.bfloat16:
        flat = flat.float()
    return {"__t": str(t.dtype), "s": list(t.shape), "d": flat.reshape(-1).tolist()}


def _encode_array(a: np.ndarray) -> dict[str, Any]:
    if a.dtype == object:
        return {"__o": [encode(v) for v in a.reshape(-1).tolist()], "s": list(a.shape)}
    if a.dtype.kind not in "biuf":
        raise Unencodable(f"a numpy array of {a.dtype}")
    return {"__n": a.dtype.str, "s": list(a.shape), "d": a.reshape(-1).tolist()}


def decode(data: Any) -> Any:
    """The value :func:`encode` wrote."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "__t" in data:
        return torch.tensor(data["d"], dtype=_TORCH_DTYPES[data["__t"]]).reshape(data["s"])
    if "__n" in data:
        return np.asarray(data["d"], dtype=np.dtype(data["__n"])).reshape(data["s"])
    if "__o" in data:
        out = np.empty(len(data["__o"]), dtype=object)
        for i, v in enumerate(data["__o"]):
            out[i] = decode(v)
        return out.reshape(data["s"])
    if "__tu" in data:
        return tuple(decode(v) for v in data["__tu"])
    if "__m" in data:
        return {k: decode(v) for k, v in data["__m"].items()}
    if "__dp" in data:
        body = data["__dp"]
        return DataProto.from_dict({k: decode(v) for k, v in body["batch"].items()},
                                   {k: decode(v) for k, v in body["non_tensor"].items()}, decode(body["meta"]))
    if "__alo" in data:
        return AgentLoopOutput(**decode(data["__alo"]))
    raise ValueError(f"not a value the rollout log writes: keys {sorted(data)[:5]}")


def encode_sample(sample: Sample) -> dict[str, Any]:
    """A finished sample of the streaming modes: its prompt row, trajectories and weight versions."""
    return {"ordinal": int(sample.ordinal), "version_start": int(sample.version_start),
            "version_end": int(sample.version_end), "submit_step": int(sample.submit_step),
            "prompt": encode(sample.prompt), "outputs": encode(list(sample.outputs)),
            "trajectory_metrics": encode(list(sample.trajectory_metrics))}


def decode_sample(data: dict[str, Any]) -> Sample:
    return Sample(ordinal=int(data["ordinal"]), prompt=decode(data["prompt"]),
                  version_start=int(data["version_start"]), version_end=int(data["version_end"]),
                  outputs=decode(data["outputs"]), trajectory_metrics=decode(data["trajectory_metrics"]),
                  submit_step=int(data["submit_step"]))
