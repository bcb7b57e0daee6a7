"""Bounds on one data row, checked when the rows are read and before anything tokenizes them.

A 200 MB row was tokenized without a size check and the OOM killer took the trainer (issue 34); a row nested
100,000 levels deep ended in a ``RecursionError`` traceback. Every row is walked once, without recursion: its
strings and bytes are summed against ``data.max_row_bytes`` and its nesting is bounded by :data:`MAX_DEPTH`.
"""

from __future__ import annotations

from typing import Any

from hybridflow.data.io import DataFileError

MAX_DEPTH = 64  # verl rows nest 3-4 levels (prompt -> message -> content part -> image)


def row_size(row: Any, where: str, max_depth: int = MAX_DEPTH) -> int:
    """Characters of the strings plus bytes of the binary values in ``row`` (an iterative walk); a row nested
    deeper than ``max_depth`` raises :class:`DataFileError`."""
    total, stack = 0, [(row, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (str, bytes, bytearray)):
            total += len(value)
        elif isinstance(value, (dict, list, tuple)):
            if depth >= max_depth:
                raise DataFileError(f"{where} nests lists/objects more than {max_depth} levels deep; a data row is a "
                                    "flat record of a chat prompt and its fields: fix the preprocessing")
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
            if isinstance(value, dict):
                total += sum(len(k) for k in value if isinstance(k, str))
    return total


def check_row_size(row: Any, where: str, max_bytes: int) -> None:
    """Refuse a row larger than ``max_bytes`` (``data.max_row_bytes``) before it is tokenized."""
    size = row_size(row, where)
    if size > max_bytes:
        raise DataFileError(
            f"{where} holds {_size(size)} of text and binary data, over data.max_row_bytes={max_bytes} "
            f"({_size(max_bytes)}): tokenizing it could exhaust the machine's memory. Fix the row, or raise "
            "data.max_row_bytes if rows this large are intended (e.g. several large images)")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} bytes"


__all__ = ["MAX_DEPTH", "check_row_size", "row_size"]
