"""Fixtures for agent-loop tests: a user's loop file + YAML and a small synthetic task on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

USER_FILES = Path(__file__).with_name("user_files")


@pytest.fixture(scope="session")
def agent_loop_yaml() -> Path:
    return USER_FILES / "agent_loops.yaml"


@pytest.fixture(scope="session")
def addition_rows(tmp_path_factory):
    from hybridflow.data.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("addition_agents")
    write_synthetic("addition", str(d), train_size=32, test_size=8, seed=0)
    return d
