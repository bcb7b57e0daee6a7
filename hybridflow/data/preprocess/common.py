"""Shared pieces of the preprocessors: finding split files, the CLI skeleton (hub datasets: ``io.read_hub_rows``)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from hybridflow.data.io import DataFileError, read_rows

_SUFFIXES = (".jsonl", ".json", ".parquet")
HUB_FIX = "without network access pass --input DIR with local files"  # what a preprocessor says when the hub fails


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
