"""Collating dataset items into the flat dict that ``DataProto.from_single_dict`` splits."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def collate_fn(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensor fields; every other field becomes a 1-D numpy object array (lists/dicts kept whole)."""
    if not items:
        raise ValueError("collate_fn got an empty list of items")
    out: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            arr = np.empty(len(values), dtype=object)
            for i, v in enumerate(values):
                arr[i] = v
            out[key] = arr
    return out
