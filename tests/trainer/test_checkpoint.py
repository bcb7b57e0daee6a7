"""Checkpoint folder mechanics: atomic commit, rotation, resume discovery, refusal of foreign folders."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from hybridflow.trainer import run_checkpoint as ckpt


def _save(root, step, components=("actor",), payload=b"w"):
    with ckpt.CheckpointWriter(root, step) as w:
        for c in components:
            (w.tmp_dir / c).mkdir()
            (w.tmp_dir / c / "model.pt").write_bytes(payload)
        w.save_trainer_state(ckpt.TrainerState(global_step=step, epoch=0, rng=ckpt.capture_rng_state()))
        w.save_data_state({"pos": step})
        return w.commit(list(components))


def test_commit_writes_layout_and_latest(tmp_path):
    folder = _save(tmp_path, 3)
    assert folder == tmp_path / "global_step_3"
    assert (tmp_path / ckpt.LATEST_FILE).read_text() == "3"
    assert {p.name for p in folder.iterdir()} == {"actor", "data.pt", "trainer_state.pt", ckpt.MANIFEST_FILE}
    assert ckpt.load_data_state(folder) == {"pos": 3}
    assert ckpt.find_resume_dir(tmp_path, "auto", None) == folder
    # no temp folders left behind
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path):
    _save(tmp_path, 1)
    with pytest.raises(RuntimeError, match="worker died"):
        with ckpt.CheckpointWriter(tmp_path, 2) as w:
            (w.tmp_dir / "actor").mkdir()
            raise RuntimeError("worker died")
    assert ckpt.completed_steps(tmp_path) == [1]
    assert (tmp_path / ckpt.LATEST_FILE).read_text() == "1"
    assert not any(".tmp-" in p.name for p in tmp_path.iterdir())


def test_commit_refuses_missing_component(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="critic"):
        with ckpt.CheckpointWriter(tmp_path, 1) as w:
            (w.tmp_dir / "actor").mkdir()
            w.commit(["actor", "critic"])
    assert ckpt.find_resume_dir(tmp_path, "auto", None) is None


def test_rotation_keeps_last_k(tmp_path):
    for s in (1, 2, 3, 4):
        _save(tmp_path, s, components=("actor", "critic"))
    ckpt.rotate_checkpoints(tmp_path, "actor", 3)
    ckpt.rotate_checkpoints(tmp_path, "critic", 1)
    assert ckpt.completed_steps(tmp_path) == [2, 3, 4]
    assert not (tmp_path / "global_step_1").exists()
    assert not (tmp_path / "global_step_2" / "critic").exists()
    assert (tmp_path / "global_step_4" / "critic").exists()
    assert ckpt.read_manifest(tmp_path / "global_step_3")["components"] == ["actor"]
    assert ckpt.rotate_checkpoints(tmp_path, "actor", None) == []


def test_half_written_and_foreign_folders_are_refused(tmp_path):
    # A verl-style folder: actor/ but no manifest.
    foreign = tmp_path / "global_step_5"
    (foreign / "actor").mkdir(parents=True)
    (tmp_path / ckpt.LATEST_FILE).write_text("5")
    with pytest.raises(ckpt.CheckpointError, match="verl checkpoint"):
        ckpt.find_resume_dir(tmp_path, "auto", None)
    with pytest.raises(ckpt.CheckpointError, match="not a complete hybridflow checkpoint"):
        ckpt.find_resume_dir(tmp_path, "resume_path", str(foreign))
    (tmp_path / ckpt.LATEST_FILE).write_text("7")
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.find_resume_dir(tmp_path, "auto", None)
    with pytest.raises(ckpt.CheckpointError, match="resume_from_path"):
        ckpt.find_resume_dir(tmp_path, "resume_path", None)
    with pytest.raises(ckpt.CheckpointError, match="global_step_N"):
        ckpt.find_resume_dir(tmp_path, "resume_path", str(tmp_path))
    assert ckpt.find_resume_dir(tmp_path, "disable", None) is None


def test_stale_temp_dirs_cleaned_and_resave_replaces(tmp_path):
    (tmp_path / "global_step_9.tmp-abc").mkdir(parents=True)
    assert len(ckpt.clean_stale_temp_dirs(tmp_path)) == 1
    _save(tmp_path, 2, payload=b"old")
    _save(tmp_path, 2, payload=b"new")
    assert (tmp_path / "global_step_2" / "actor" / "model.pt").read_bytes() == b"new"
    assert ckpt.completed_steps(tmp_path) == [2]


def test_rng_state_round_trip():
    state = ckpt.capture_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


# ---------------------------------------------------------------------------------------------- one writer
HOLD_LOCK = """
import sys, time
from hybridflow.trainer import run_checkpoint as ckpt
ckpt.lock_checkpoint_dir(sys.argv[1])
print("held", flush=True)
time.sleep(300)
"""


def hold_lock_in_another_process(folder) -> subprocess.Popen:
    """A second process (another run) holding ``folder``; kill it to leave a stale lock behind."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_of_a_checkpoint_folder_is_refused_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    """Issue 34: two runs writing one folder both succeeded, interleaving global_step_*."""
    holder = hold_lock_in_another_process(tmp_path)
    try:
        with pytest.raises(ckpt.CheckpointError) as err:
            ckpt.lock_checkpoint_dir(tmp_path)
        text = str(err.value)
        assert f"checkpoint folder {tmp_path} is in use: another run (pid {holder.pid} on host " \
               f"{socket.gethostname()}" in text, text
        assert "trainer.default_local_dir" in text and ckpt.RUN_LOCK_FILE in text
    finally:
        holder.kill()  # dies holding it: the lock file stays, its flock goes with the process
        holder.wait()
    assert json.loads((tmp_path / ckpt.RUN_LOCK_FILE).read_text())["pid"] == holder.pid
    lock = ckpt.lock_checkpoint_dir(tmp_path)
    assert f"(pid {holder.pid}) is gone; taking it over" in capsys.readouterr().err
    assert ckpt.lock_checkpoint_dir(tmp_path) is lock  # re-entrant in one process
    assert json.loads((tmp_path / ckpt.RUN_LOCK_FILE).read_text())["pid"] == os.getpid()
    ckpt.release_checkpoint_dir(tmp_path)
    assert not (tmp_path / ckpt.RUN_LOCK_FILE).exists()
    after = hold_lock_in_another_process(tmp_path)  # released: the next run takes it at once
    after.kill()
    after.wait()


def test_a_lock_left_by_a_run_on_another_host_is_not_taken_silently(tmp_path):
    (tmp_path / ckpt.RUN_LOCK_FILE).write_text(json.dumps({"pid": 4242, "host": "node-elsewhere", "since": 0}))
    with pytest.raises(ckpt.CheckpointError, match=r"pid 4242 on host node-elsewhere.*if that run has ended, "
                                                    r"delete .*hybridflow_run.lock"):
        ckpt.lock_checkpoint_dir(tmp_path)
