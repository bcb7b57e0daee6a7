"""Reading verl-format row files (parquet / json / jsonl, or a hub dataset name) into Python dicts.

The RL datasets are small (thousands of prompts), so rows are held as a list of plain dicts: indexing is then
trivial, pickles cheaply into dataloader workers, and there is no Arrow/pandas type juggling later. Parquet is
read with pyarrow directly (fast, no cache directory); hub names go through ``datasets.load_dataset`` so users
coming from verl can still pass e.g. ``openai/gsm8k``.
"""

from __future__ import annotations

import json
import os
from typing import Any

_LOCAL_SUFFIXES = (".parquet", ".json", ".jsonl")


class DataFileError(ValueError):
    """A data file is missing, unreadable or not in the expected format."""


def as_file_list(files: Any, field: str) -> list[str]:
    if isinstance(files, str):
        return [files]
    if not isinstance(files, (bytes, dict)) and hasattr(files, "__iter__"):  # list, tuple, omegaconf ListConfig
        paths = list(files)
        if paths and all(isinstance(f, str) for f in paths):
            return paths
    raise DataFileError(f"{field} must be a path or a non-empty list of paths, got {files!r}")


def read_rows(path: str) -> list[dict[str, Any]]:
    """All rows of one file (or hub dataset ``name`` / ``name:split``) as dicts."""
    full = os.path.expanduser(path)
    suffix = os.path.splitext(full)[1].lower()
    if os.path.exists(full) or suffix in _LOCAL_SUFFIXES:
        if not os.path.isfile(full):
            what = "is a directory, not a file" if os.path.isdir(full) else "does not exist"
            raise DataFileError(f"data file '{path}' {what}; check data.train_files / data.val_files")
        if suffix == ".parquet":
            return _read_parquet(full)
        if suffix in (".json", ".jsonl"):
            return _read_json(full)
        raise DataFileError(f"data file '{path}' has unsupported suffix '{suffix}'; use .parquet, .json or .jsonl")
    return _read_hub(path)


def count_rows(path: str) -> int | None:
    """Rows of one data file without building the dataset (a parquet file's metadata; json is parsed), ``None`` for
    a hub dataset (known once it downloads). Raises :class:`DataFileError` as :func:`read_rows` does."""
    full = os.path.expanduser(path)
    suffix = os.path.splitext(full)[1].lower()
    if not (os.path.exists(full) or suffix in _LOCAL_SUFFIXES):
        return None
    if os.path.isfile(full) and suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return int(pq.ParquetFile(full).metadata.num_rows)
        except Exception as exc:  # pyarrow raises several types for corrupt / non-parquet files
            raise DataFileError(f"cannot read parquet file '{path}': {type(exc).__name__}: {exc}. The file is corrupt "
                                "or not parquet; re-run the preprocessing (e.g. `hybridflow data gsm8k`)") from exc
    return len(read_rows(path))


def _read_parquet(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:  # ParquetFile reads the one file without importing pyarrow.dataset (0.3 s of start-up)
        return pq.ParquetFile(path).read().to_pylist()
    except RecursionError:
        raise DataFileError(f"'{path}' nests lists/structs deeper than can be read (RecursionError); a data row is "
                            "a flat record of a chat prompt and its fields: fix the preprocessing") from None
    except Exception as exc:  # pyarrow raises several types for corrupt / non-parquet files
        raise DataFileError(
            f"cannot read parquet file '{path}': {type(exc).__name__}: {exc}. The file is corrupt or not parquet; "
            "re-run the preprocessing (e.g. `hybridflow data gsm8k`) to regenerate it"
        ) from exc


def _read_json(path: str) -> list[dict[str, Any]]:
    """A JSON array / ``{column: [values]}`` object, or JSON lines."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFileError(f"cannot read '{path}': {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    except RecursionError:
        raise DataFileError(_too_deep(path)) from None
    if isinstance(data, list):
        rows = data
    elif isinstance(data, dict) and data and all(isinstance(v, list) for v in data.values()):
        n = {len(v) for v in data.values()}
        if len(n) != 1:
            raise DataFileError(f"'{path}' is a column-oriented JSON object whose columns differ in length")
        rows = [dict(zip(data, values)) for values in zip(*data.values())]
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataFileError(
                    f"'{path}' line {lineno} is not valid JSON ({exc.msg}); expected a JSON array or one JSON "
                    "object per line (jsonl)"
                ) from None
            except RecursionError:
                raise DataFileError(_too_deep(path, lineno)) from None
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataFileError(f"'{path}' row {bad} is a {type(rows[bad]).__name__}, expected an object per row")
    return rows


def _too_deep(path: str, lineno: int | None = None) -> str:
    where = f"'{path}' line {lineno}" if lineno else f"'{path}'"
    return (f"{where} nests JSON arrays/objects deeper than the JSON reader can follow (RecursionError); a data row "
            "is a flat record of a chat prompt and its fields: fix the preprocessing")


_HUB_NAME_FIX = ("it is not a local file either: pass a local .parquet/.json/.jsonl path, or 'owner/name:split' "
                 "with network access")


def _read_hub(name: str) -> list[dict[str, Any]]:
    """A data file entry that is not a local path: ``owner/name`` or ``owner/name:split`` (default split: train)."""
    repo, _, split = name.partition(":")
    return read_hub_rows(repo, split or "train", fix=_HUB_NAME_FIX)


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (one connection attempt, 5 s at most), or None. Offline mode
    (``HF_HUB_OFFLINE=1``: the local cache only) is not probed."""
    import socket
    from urllib.parse import urlsplit

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return None
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5.0).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"
    return None


def read_hub_rows(name: str, split: str, config_name: str | None = None, fix: str = "") -> list[dict[str, Any]]:
    """All rows of ``split`` of the hub dataset ``name`` (configuration ``config_name``) as dicts, through
    ``datasets.load_dataset``: the one place hybridflow loads a dataset from the hub (run files and the
    preprocessors alike).  Any failure is a :class:`DataFileError` naming the dataset and ``fix``, what to do.
    The hub is probed once first: without network ``datasets`` retries for about a minute, printing each retry."""
    what = f"'{name}'" + (f" (configuration '{config_name}')" if config_name else "") + f" split '{split}'"
    unreachable = _hub_unreachable()
    if unreachable:
        raise DataFileError(f"cannot reach the Hugging Face hub to download {what} ({unreachable}); "
                            f"{fix or 'check the network'}")
    try:
        import datasets

        ds = datasets.load_dataset(name, config_name, split=split)
    except Exception as exc:  # datasets raises many types: offline, unknown name, unknown split, bad files
        raise DataFileError(f"could not load hub dataset {what} ({type(exc).__name__}: {exc}); "
                            f"{fix or 'check the name and the network'}") from exc
    return [dict(r) for r in ds]


def write_parquet(rows: list[dict[str, Any]], path: str) -> str:
    """Write rows to parquet (parent directories created); returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        raise DataFileError(f"refusing to write an empty dataset to '{path}'")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
