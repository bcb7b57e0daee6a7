"""verl's ``verl.utils.tensordict_utils.get_tensordict`` (``tensordict`` is an optional extra here: installed, a
``TensorDict`` is built the way verl builds it, so code written against verl's interop runs unchanged).

``get_tensordict(tensor_dict, non_tensor_dict)``: tensors as they are (a nested tensor must be jagged and
contiguous), every list a ``NonTensorStack`` of one ``NonTensorData`` per row (so lists of lists and lists of dicts
keep their shape), every ``non_tensor_dict`` entry a ``NonTensorData``; the batch size is the shared length.
``DataProto.from_tensordict`` reads such a TensorDict back.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["get_tensordict"]


def _tensordict():
    try:
        import tensordict
    except ImportError as e:
        raise ModuleNotFoundError("get_tensordict needs the 'tensordict' package (>= 0.10): pip install "
                                  "'hybridflow[tensordict]'") from e
    return tensordict


def _length(key: str, value: Any) -> int:
    if isinstance(value, torch.Tensor):
        if value.is_nested and (value.layout != torch.jagged or not value.is_contiguous()):
            raise ValueError(f"get_tensordict: nested tensor '{key}' must be jagged and contiguous "
                             "(torch.nested.as_nested_tensor(..., layout=torch.jagged))")
        return int(value.shape[0]) if not value.is_nested else int(value.size(0))
    return len(value)


def get_tensordict(tensor_dict: dict[str, Any], non_tensor_dict: dict[str, Any] | None = None):
    """A ``TensorDict`` of ``tensor_dict``'s columns (tensors, lists, ``NonTensorStack``) and ``non_tensor_dict``'s
    batch-level values; the columns must share their length."""
    td = _tensordict()
    columns: dict[str, Any] = {}
    sizes = {key: _length(key, value) for key, value in tensor_dict.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"get_tensordict: the columns have different lengths {sizes}; give every column one "
                         "entry per row")
    for key, value in tensor_dict.items():
        if isinstance(value, (torch.Tensor, td.NonTensorStack)):
            columns[key] = value
        else:
            columns[key] = td.NonTensorStack.from_list([td.NonTensorData(item) for item in value])
    out = td.TensorDict(columns, batch_size=[next(iter(sizes.values()), 0)])
    for key, value in (non_tensor_dict or {}).items():
        out[key] = td.NonTensorData(value)
    return out
