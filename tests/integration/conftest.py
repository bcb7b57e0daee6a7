"""Shared pieces of the end-to-end runs: a synthetic task on disk and small verl command lines."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def addition_data(tmp_path_factory):
    """``train.parquet`` (64 prompts) and ``test.parquet`` (16) of the built-in addition task."""
    from hybridflow.data.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("addition")
    write_synthetic("addition", str(d), train_size=64, test_size=16, seed=0)
    return d


from run_helpers import run, small_overrides  # noqa: E402,F401 - re-exported for `from .conftest import ...`
