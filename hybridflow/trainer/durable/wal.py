"""An append-only log of JSON records that survives ``kill -9`` at any moment.

Each record is one frame: ``b"HFW1"``, the payload's length and CRC-32 (4 bytes each, little endian), then the
payload (UTF-8 JSON).  :meth:`WriteAheadLog.append` writes the frame and ``fsync``s it before returning, so a record
the caller went on from is on disk.  A kill in the middle of an append leaves a torn last frame: reading stops at
the first frame whose magic, length or checksum is wrong, and opening the log for appending cuts it off.
:meth:`WriteAheadLog.append_many` writes several records with one ``fsync`` (a group commit).

:meth:`WriteAheadLog.rewrite` replaces the whole log (compaction) atomically: the new records go to a temporary
file that is ``fsync``ed and renamed over the log, then the folder is ``fsync``ed -- a kill leaves the old log or
the new one, never a mix.  ``max_bytes`` bounds the log: :meth:`append` of a record that would pass it returns
``False`` unless ``force`` (small bookkeeping records are always written).
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any, Iterable

__all__ = ["WriteAheadLog", "read_records"]

_MAGIC = b"HFW1"
_HEAD = struct.Struct("<4sII")


def _frame(record: dict[str, Any]) -> bytes:
    payload = json.dumps(record, separators=(",", ":")).encode("utf-8")
    return _HEAD.pack(_MAGIC, len(payload), zlib.crc32(payload)) + payload


def _scan(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The records of ``data`` up to the first damaged frame, and the byte length they fill."""
    records, pos = [], 0
    while pos + _HEAD.size <= len(data):
        magic, length, crc = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + length
        if magic != _MAGIC or end > len(data):
            break
        payload = data[pos + _HEAD.size:end]
        if zlib.crc32(payload) != crc:
            break
        try:
            records.append(json.loads(payload.decode("utf-8")))
        except (UnicodeDecodeError, json.JSONDecodeError):
            break
        pos = end
    return records, pos


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The intact records of the log at ``path`` (none when it does not exist)."""
    path = Path(path)
    return _scan(path.read_bytes())[0] if path.exists() else []


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriteAheadLog:
    """The log at ``path`` (see the module docstring); thread-safe."""

    def __init__(self, path: str | os.PathLike, max_bytes: int):
        self.path = Path(path)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        records, good = _scan(self.path.read_bytes()) if self.path.exists() else ([], 0)
        self.torn_bytes = (self.path.stat().st_size - good) if self.path.exists() else 0
        self.records_at_open = records
        self._file = open(self.path, "ab")
        if self.torn_bytes:  # a kill tore the last frame: cut it off before appending after it
            self._file.truncate(good)
            self._sync()
        self.size = good

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def append(self, record: dict[str, Any], force: bool = False) -> bool:
        """Write ``record`` and fsync it; ``False`` (nothing written) when it would pass ``max_bytes``."""
        frame = _frame(record)
        with self._lock:
            if not force and self.size + len(frame) > self.max_bytes:
                return False
            self._file.write(frame)
            self._sync()
            self.size += len(frame)
        return True

    def append_many(self, records: list[dict[str, Any]]) -> list[bool]:
        """:meth:`append` for several records with one fsync (a group commit); which of them were written."""
        frames = [_frame(r) for r in records]
        written = []
        with self._lock:
            for frame in frames:
                fits = self.size + len(frame) <= self.max_bytes
                if fits:
                    self._file.write(frame)
                    self.size += len(frame)
                written.append(fits)
            if any(written):
                self._sync()
        return written

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the log by ``records`` (atomically, see the module docstring)."""
        data = b"".join(_frame(r) for r in records)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with self._lock:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
            self._file.close()
            self._file = open(self.path, "ab")
            self.size = len(data)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
