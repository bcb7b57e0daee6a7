"""Shared pieces of the preprocessors: finding split files, loading hub datasets, the CLI skeleton."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from hybridflow.data.io import DataFileError, read_rows

_SUFFIXES = (".jsonl", ".json", ".parquet")


def read_split(input_dir: str, split: str) -> list[dict[str, Any]]:
    """Rows of ``<input_dir>/<split>.{jsonl,json,parquet}``."""
    for suffix in _SUFFIXES:
        path = os.path.join(input_dir, split + suffix)
        if os.path.isfile(path):
            return read_rows(path)
    found = sorted(os.listdir(input_dir)) if os.path.isdir(input_dir) else []
    raise DataFileError(
        f"no {split} file in '{input_dir}': expected {split}.jsonl, {split}.json or {split}.parquet "
        f"(found: {', '.join(found) or 'nothing'}). Pass --input pointing at the folder with those files, or "
        "omit --input to download from the hub"
    )


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


def load_hub_split(name: str, split: str, config_name: str | None = None) -> list[dict[str, Any]]:
    unreachable = _hub_unreachable()  # before datasets' own retries (a minute of backoff messages)
    if unreachable:
        raise DataFileError(f"cannot reach the Hugging Face hub to download '{name}' ({unreachable}); without "
                            "network access pass --input DIR with local files")
    try:
        import datasets

        ds = datasets.load_dataset(name, config_name, split=split)
    except Exception as exc:
        raise DataFileError(
            f"could not load '{name}' split '{split}' from the hub ({type(exc).__name__}: {exc}); "
            "without network access pass --input DIR with local files"
        ) from exc
    return [dict(r) for r in ds]


def require_columns(rows: list[dict[str, Any]], columns: tuple[str, ...], source: str) -> None:
    if not rows:
        raise DataFileError(f"{source} has no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise DataFileError(f"{source} lacks column(s) {missing}; found {sorted(rows[0])}")


def standard_parser(parser: argparse.ArgumentParser, default_dir: str, with_input: bool = True) -> None:
    if with_input:
        parser.add_argument("--input", default=None, help="local folder with train/test files (default: the hub)")
    parser.add_argument("--local-dir", "--local_dir", "--local_save_dir", dest="local_dir", default=default_dir,
                        help=f"output folder for train.parquet / test.parquet (default {default_dir})")


def run_main(setup: Callable[[argparse.ArgumentParser], None], run: Callable[[argparse.Namespace], dict],
             prog: str, argv: list[str] | None) -> dict:
    parser = argparse.ArgumentParser(prog=prog)
    setup(parser)
    paths = run(parser.parse_args(argv))
    for split, path in paths.items():
        print(f"{split}: {path}")
    return paths
