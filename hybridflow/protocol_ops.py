"""Helpers of :mod:`hybridflow.protocol` that do not need the ``DataProto`` class itself.

Everything here is re-exported by ``hybridflow.protocol`` (verl's ``verl.protocol`` path): the batch errors,
NaN-aware equality for ``union``, the meta-info merge of ``concat``, batch-dim folding, single-tensor
serialisation, the auto-padding switch and the optional ``tensordict`` conversions.

Errors: where verl asserts, the error raised here is also an ``AssertionError`` (verl users catch that),
and also the exception type that says what went wrong (``ValueError``, ``KeyError``, ``TypeError``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import torch

__all__ = [
    "TensorBatch",
    "DataProtoItem",
    "BatchSizeError",
    "ProtocolValueError",
    "ProtocolKeyError",
    "ProtocolTypeError",
    "DataProtoConfig",
    "AUTO_PADDING_KEY",
    "deep_equal",
    "union_tensor_dict",
    "union_numpy_dict",
    "merge_meta_info",
    "fold_batch_dim",
    "unfold_batch_dim",
    "serialize_single_tensor",
    "deserialize_single_tensor",
]


# ---------------------------------------------------------------------------------------------- errors
class BatchSizeError(ValueError, AssertionError):
    """The tensors / arrays of a batch disagree on their first dimension (or a split does not divide)."""


class ProtocolValueError(ValueError, AssertionError):
    """A DataProto operation got values it cannot combine (conflicting keys, bad sizes)."""


class ProtocolKeyError(KeyError, AssertionError):
    """A DataProto operation named a key the batch does not have (or batches disagree on their keys)."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0]) if self.args else ""


class ProtocolTypeError(TypeError, AssertionError):
    """A DataProto operation got an argument of the wrong type."""


# ---------------------------------------------------------------------------------------------- containers
class TensorBatch(dict):
    """A ``dict[str, Tensor]`` whose values share dim 0; ``batch_size`` mirrors TensorDict's. A batch without
    tensors keeps the row count it was given (``TensorBatch(batch_size=10)``, as an empty ``TensorDict`` of batch
    size 10 does), through copies to a device, selections and pickling."""

    def __init__(self, *args, batch_size: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows = None if batch_size is None else int(batch_size)

    @property
    def batch_size(self) -> torch.Size:
        for v in self.values():
            return torch.Size([v.shape[0]])
        return torch.Size([getattr(self, "rows", None) or 0])

    def to(self, device) -> "TensorBatch":
        return TensorBatch({k: v.to(device) for k, v in self.items()}, batch_size=self.batch_size[0])

    def select(self, *keys: str) -> "TensorBatch":
        missing = [k for k in keys if k not in self]
        if missing:
            raise ProtocolKeyError(f"select: tensor keys {missing} not in batch; available: {sorted(self)}")
        return TensorBatch({k: self[k] for k in keys}, batch_size=self.batch_size[0])


def as_object_array(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    seq = list(values)
    arr = np.empty(len(seq), dtype=object)
    for i, v in enumerate(seq):  # element-wise so lists/dicts stay whole objects
        arr[i] = v
    return arr


def as_tensor_batch(batch: Any) -> TensorBatch:
    if isinstance(batch, TensorBatch):
        return batch
    if batch is None:
        return TensorBatch()
    size = getattr(batch, "batch_size", None)  # a TensorDict from verl code: its row count, even without keys
    rows = int(size[0]) if size is not None and len(size) > 0 else None
    return TensorBatch(dict(batch.items()), batch_size=rows)


def batch_len(tensors: dict[str, torch.Tensor], non_tensors: dict[str, np.ndarray]) -> int | None:
    sizes = {k: int(v.shape[0]) for k, v in tensors.items()}
    sizes.update({k: len(v) for k, v in non_tensors.items()})
    distinct = set(sizes.values())
    if len(distinct) > 1:
        detail = ", ".join(f"{k}={n}" for k, n in sizes.items())
        raise BatchSizeError(
            f"All entries of a DataProto must share the batch dimension, got {detail}. "
            "Make every tensor's dim 0 and every non-tensor list the same length."
        )
    return distinct.pop() if distinct else None


def repeat_counts(repeat_times: Any) -> np.ndarray:
    if isinstance(repeat_times, (torch.Tensor, np.ndarray)):
        if repeat_times.ndim != 1:
            raise ProtocolValueError(f"sample_level_repeat: repeat_times must be 1-D, got shape {tuple(repeat_times.shape)}")
        counts = np.asarray(repeat_times.tolist())
    elif isinstance(repeat_times, (list, tuple)):
        counts = np.asarray(list(repeat_times))
    else:
        raise ProtocolTypeError("sample_level_repeat: repeat_times type must be in [list, torch.Tensor, np.ndarray, "
                                f"tuple], got {type(repeat_times).__name__}")
    if counts.size and (counts.dtype.kind not in "iu" or (counts < 0).any()):
        raise ProtocolValueError(f"sample_level_repeat: repeat_times must be non-negative integers, got {counts.tolist()}")
    return counts.astype(np.int64)


@dataclass
class DataProtoItem:
    """One row (``data[i]`` with an integer): ``batch`` maps names to that row's tensors, ``non_tensor_batch``
    to that row's values (``item.non_tensor_batch["reward_model"]["ground_truth"]``), as in verl."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def type_info(value: Any) -> str:
    if isinstance(value, list):
        return f"list[{'|'.join(sorted({type_info(v) for v in value[:3]})) or '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        k, v = next(iter(value.items()))
        return f"dict[{type_info(k)}: {type_info(v)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__


# ---------------------------------------------------------------------------------------------- padding
AUTO_PADDING_KEY = "_verl_auto_padding"  # verl's meta_info flag name, so batches keep their meaning


class _AutoPaddingSwitch(type):
    _enabled = False

    @property
    def auto_padding(cls) -> bool:
        env = os.getenv("VERL_AUTO_PADDING", os.getenv("HYBRIDFLOW_AUTO_PADDING", "false")).strip().lower()
        return env in ("true", "1") or cls._enabled

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise ProtocolTypeError(f"DataProtoConfig.auto_padding must be a bool, got {enabled!r}")
        cls._enabled = enabled


class DataProtoConfig(metaclass=_AutoPaddingSwitch):
    """Process-wide switch ``DataProtoConfig.auto_padding = True`` (or ``VERL_AUTO_PADDING=1``): every
    ``DataProto.chunk`` accepts a length that does not divide, as with ``from_dict(..., auto_padding=True)``."""


# ---------------------------------------------------------------------------------------------- equality
def deep_equal(a: Any, b: Any, _seen: set[int] | None = None) -> bool:
    """Equality for ``union``: NaN equals NaN, arrays compare shape and every element (recursively for object
    arrays, lists, tuples and dicts; equal values held with different dtypes are equal, where verl compares
    dtypes too), and self-referencing containers do not recurse forever."""
    seen = set() if _seen is None else _seen
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape:
            return False
        if a.dtype == b.dtype and a.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        # object arrays, or the same values held with different dtypes (a str array vs an object array of str)
        return _recurse(a, b, seen, lambda: zip(a.flat, b.flat))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.nan_to_num(0.5), b.nan_to_num(0.5))
                                          and torch.equal(a.isnan(), b.isnan())))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return _recurse(a, b, seen, lambda: zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return False
        return _recurse(a, b, seen, lambda: ((a[k], b[k]) for k in a))
    try:
        eq = a == b
        if isinstance(eq, np.ndarray):
            return bool(eq.all())
        return bool(eq)
    except Exception:  # objects that cannot be compared are different unless they are the same object
        return a is b


def _recurse(a: Any, b: Any, seen: set[int], pairs) -> bool:
    if id(a) in seen:  # a cycle: the structure up to here matched
        return True
    seen.add(id(a))
    try:
        return all(deep_equal(x, y, seen) for x, y in pairs())
    finally:
        seen.discard(id(a))


def union_tensor_dict(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add ``b``'s tensors to ``a`` (in place, as verl; ``a`` is returned); a key in both must hold equal
    values, and both must have the same batch size."""
    na = next((int(v.shape[0]) for v in a.values()), None)
    nb = next((int(v.shape[0]) for v in b.values()), None)
    if na is not None and nb is not None and na != nb:
        raise BatchSizeError(f"union: the two batches have different batch sizes ({na} vs {nb})")
    for k, v in b.items():
        if k in a and not (a[k].shape == v.shape and torch.equal(a[k], v)):
            raise ProtocolValueError(f"union: key '{k}' exists in both batches with different values")
        a[k] = v
    return a


def union_numpy_dict(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``b``'s arrays to ``a`` (in place, ``a`` returned); a key in both must hold equal arrays, where
    NaN equals NaN (so a float column with missing values unions with itself)."""
    for k, v in b.items():
        if k in a:
            if not (isinstance(a[k], np.ndarray) and isinstance(v, np.ndarray)):
                raise ProtocolTypeError(f"union: non-tensor key '{k}' must hold numpy arrays on both sides")
            if not deep_equal(a[k], v):
                raise ProtocolValueError(f"`{k}` in tensor_dict1 and tensor_dict2 are not the same object. "
                                         f"(union: non-tensor key '{k}' exists in both batches with different values)")
        a[k] = v
    return a


# ---------------------------------------------------------------------------------------------- concat meta
def merge_meta_info(metas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``concat``'s meta-info: every key of every part (a key two parts give different values is an error),
    and ``metrics`` gathered from all parts into one ``{name: [values...]}``.

    A part's ``metrics`` may be a dict or a list of dicts (one per micro-batch or worker); scalar values are
    appended in part order, list values are concatenated.
    """
    merged: dict[str, Any] = {}
    metric_dicts: list[dict] = []
    for meta in metas:
        for k, v in meta.items():
            if k == "metrics":
                if v is None:
                    continue
                for item in (v if isinstance(v, list) else [v]):
                    if not isinstance(item, dict):
                        raise ProtocolTypeError(f"concat: meta_info['metrics'] must be a dict or a list of dicts, "
                                                f"got an item of type {type(item).__name__}")
                    metric_dicts.append(item)
            elif k in merged:
                if not deep_equal(merged[k], v):
                    raise ProtocolValueError(f"Conflicting values for meta_info key '{k}' in concat: "
                                             f"{merged[k]!r:.100} vs {v!r:.100}")
            else:
                merged[k] = v
    if metric_dicts:
        out: dict[str, list] = {}
        for d in metric_dicts:
            for name, value in d.items():
                out.setdefault(name, []).extend(value if isinstance(value, list) else [value])
        merged["metrics"] = out
    return merged


# ---------------------------------------------------------------------------------------------- batch dims
def fold_batch_dim(data, new_batch_size: int):
    """``[bsz, ...]`` -> ``[new_batch_size, bsz // new_batch_size, ...]`` for every tensor and non-tensor
    array (e.g. the ``n`` samples of each prompt as one row); the result still has one batch dim."""
    n = len(data)
    if new_batch_size <= 0 or n % new_batch_size != 0:
        raise BatchSizeError(f"fold_batch_dim: batch of {n} rows cannot be folded into {new_batch_size} rows")
    tensors = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.batch.items()}
    non = {k: np.reshape(v, (new_batch_size, -1, *v.shape[1:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=tensors, non_tensor_batch=non, meta_info=data.meta_info)


def unfold_batch_dim(data, batch_dims: int = 2):
    """The inverse of :func:`fold_batch_dim`: the first ``batch_dims`` dims become one batch dim."""
    if batch_dims < 1:
        raise ProtocolValueError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}")
    shapes = {k: tuple(v.shape[:batch_dims]) for k, v in data.batch.items()}
    shapes.update({k: tuple(v.shape[:batch_dims]) for k, v in data.non_tensor_batch.items()})
    if len(set(shapes.values())) > 1:
        raise BatchSizeError(f"unfold_batch_dim: entries disagree on their first {batch_dims} dims: {shapes}")
    tensors = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.batch.items()}
    non = {k: np.reshape(v, (-1, *v.shape[batch_dims:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=tensors, non_tensor_batch=non, meta_info=data.meta_info)


# ---------------------------------------------------------------------------------------------- serialisation
def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, torch.Size, np.ndarray]:
    """``(dtype name, shape, raw bytes as a uint8 numpy array)`` of a tensor (any dtype, bf16 included)."""
    raw = obj.detach().cpu().flatten().contiguous().view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), obj.shape, raw


def deserialize_single_tensor(arr: tuple[str, Any, Any]) -> torch.Tensor:
    """The tensor :func:`serialize_single_tensor` described (a new, writable CPU tensor)."""
    dtype_name, shape, data = arr
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolTypeError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype")
    buffer = bytearray(data)
    flat = torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).view(tuple(shape))


def serialize_tensordict(batch: Any) -> tuple[tuple[int, ...], str | None, dict[str, tuple]]:
    """verl's numpy serialisation of a ``TensorDict`` (or a :class:`TensorBatch`): ``(batch_size, device, items)``
    with each tensor as :func:`serialize_single_tensor`'s triple and each nested tensor as ``(layout, [triples of
    its components])``. Read back by :func:`deserialize_tensordict`."""
    items: dict[str, tuple] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ProtocolTypeError(f"serialize_tensordict: '{key}' is a {type(value).__name__}, not a tensor")
        if value.is_nested:
            items[key] = (str(value.layout).removeprefix("torch."), [serialize_single_tensor(t) for t in value.unbind()])
        else:
            items[key] = serialize_single_tensor(value)
    device = getattr(batch, "device", None)
    return tuple(int(d) for d in batch.batch_size), None if device is None else str(device), items


def deserialize_tensordict(arr: Any) -> Any:
    """The ``TensorDict`` :func:`serialize_tensordict` described (needs the optional ``tensordict`` package)."""
    td_mod = _tensordict_module()
    batch_size, device, items = arr
    decoded: dict[str, torch.Tensor] = {}
    for key, value in items.items():
        if len(value) == 3:
            decoded[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, parts = value
            decoded[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(p) for p in parts],
                                                         layout=getattr(torch, layout))
        else:
            raise ProtocolValueError(f"deserialize_tensordict: '{key}' is encoded with {len(value)} fields; expected "
                                     "3 (a tensor) or 2 (a nested tensor)")
    return td_mod.TensorDict(source=decoded, batch_size=batch_size, device=device)


# ---------------------------------------------------------------------------------------------- tensordict
def _tensordict_module():
    """``tensordict`` (>= 0.10), imported only when a conversion is asked for: hybridflow does not need it
    (its batches are plain dicts of tensors), and importing it costs seconds."""
    try:
        import tensordict
    except ImportError as e:
        raise ModuleNotFoundError(
            "DataProto <-> TensorDict conversion needs the 'tensordict' package (>= 0.10), which hybridflow does "
            "not install by default: pip install 'tensordict>=0.10' (or the [tensordict] extra)") from e
    return tensordict


def to_tensordict(data) -> Any:
    """verl's ``DataProto.to_tensordict``: tensors as they are, each non-tensor column a ``NonTensorStack``
    (one ``NonTensorData`` per row, so nested lists and dicts survive), each meta-info entry a
    ``NonTensorData``."""
    td_mod = _tensordict_module()
    from tensordict import NonTensorData, NonTensorStack

    common = set(data.batch) & set(data.non_tensor_batch)
    if common:
        raise ProtocolValueError(f"to_tensordict: keys {sorted(common)} are both tensors and non-tensors")
    n = len(data)
    source: dict[str, Any] = dict(data.batch)
    for k, v in data.non_tensor_batch.items():
        source[k] = NonTensorStack.from_list([NonTensorData(item) for item in v])
    out = td_mod.TensorDict(source, batch_size=[n])
    for k, v in data.meta_info.items():
        out[k] = NonTensorData(v)
    return out


def from_tensordict(cls, tensor_dict, meta_info: dict | None = None, num_batch_dims: int = 1):
    """verl's ``DataProto.from_tensordict``: tensors -> ``batch``, ``NonTensorStack`` -> non-tensor columns,
    ``NonTensorData`` -> ``meta_info``."""
    _tensordict_module()
    from tensordict import NonTensorData, NonTensorStack

    if num_batch_dims != 1:
        raise ProtocolValueError("from_tensordict: only num_batch_dims=1 is supported (a DataProto has one "
                                 "batch dim; fold rows with fold_batch_dim instead)")
    meta = dict(meta_info or {})
    tensors: dict[str, torch.Tensor] = {}
    non: dict[str, np.ndarray] = {}
    for key, val in tensor_dict.items():
        if isinstance(val, torch.Tensor):
            tensors[key] = val
        elif isinstance(val, NonTensorStack):
            arr = np.empty(len(val), dtype=object)
            for i, item in enumerate(val):
                arr[i] = item.data if isinstance(item, NonTensorData) else item
            non[key] = arr
        elif isinstance(val, NonTensorData):
            meta[key] = val.data
        else:
            raise ProtocolTypeError(f"from_tensordict: entry '{key}' of type {type(val).__name__} is neither a "
                                    "tensor, a NonTensorStack nor a NonTensorData")
    return cls(batch=tensors, non_tensor_batch=non, meta_info=meta)


__all__ += ["to_tensordict", "from_tensordict", "serialize_tensordict", "deserialize_tensordict"]
