"""Checkpoint files are read with weights_only=True and hybridflow's allow-list (issue 24): what our checkpoints
hold loads, a crafted pickle is refused with its path and runs nothing, a broken file is named."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from hybridflow.utils.safe_load import (
    CheckpointFileError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
    load_torch_file,
)


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_what_our_checkpoints_hold_loads(tmp_path):
    state = {"model": {"w": torch.ones(3)}, "rng": {"numpy": np.random.get_state(), "torch": torch.get_rng_state()},
             "step": 3, "lr": [1e-3], "name": "actor"}
    torch.save(state, tmp_path / "ok.pt")
    back = load_torch_file(tmp_path / "ok.pt")
    assert torch.equal(back["model"]["w"], torch.ones(3)) and back["step"] == 3
    np.random.set_state(back["rng"]["numpy"])  # a real numpy RNG state


@pytest.mark.parametrize("writer", ["torch", "pickle"])
def test_a_crafted_file_is_refused_and_runs_nothing(tmp_path, writer):
    marker = tmp_path / "PWNED"
    path = tmp_path / "evil.pt"
    if writer == "torch":
        torch.save({"x": _Payload(marker)}, path)
    else:
        path.write_bytes(pickle.dumps({"x": _Payload(marker)}))
    # a torch file names the global it wanted; a raw pickle is not even read as one
    expected = UnsafeCheckpointError if writer == "torch" else CorruptCheckpointError
    with pytest.raises(expected, match=str(path)) as err:
        load_torch_file(path)
    assert isinstance(err.value, CheckpointFileError) and err.value.path == str(path)
    if writer == "torch":
        assert "refusing to load" in str(err.value) and "posix.system" in str(err.value)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "empty", "garbage"])
def test_a_broken_file_is_named(tmp_path, damage):
    path = tmp_path / "shard.pt"
    torch.save({"w": torch.zeros(1000)}, path)
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "empty": b"", "garbage": b"not a checkpoint" * 8}[damage])
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint file {path} .*truncated or not a torch checkpoint"):
        load_torch_file(path)
