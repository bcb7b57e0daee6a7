"""No data loss on resume, and checkpoint files that cannot run code (issue 24).

One run writes complete checkpoints at steps 2, 4 and 6; each case copies that folder, breaks it the way the
issue describes (tracker file deleted, a truncated shard, a crafted pickle, a full disk) and runs the real
``hybridflow train`` again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import base_args, invoke_cli, read_metrics

SAVE = ["trainer.save_freq=2", "trainer.total_epochs=10"]


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory, fault_data, nano_model_dir):
    """A finished 6-step run with complete checkpoints at steps 2, 4, 6 (its folder is copied per case)."""
    root = tmp_path_factory.mktemp("six_steps")
    result = invoke_cli(base_args(nano_model_dir, fault_data / "train.parquet", root, steps=6, extra=SAVE), root)
    assert result.escaped is None and result.rc == 0, result.message
    assert ckpt.completed_steps(root / "ckpt") == [2, 4, 6]
    return root


@pytest.fixture
def run_dir(six_steps, tmp_path):
    shutil.copytree(six_steps / "ckpt", tmp_path / "ckpt")
    return tmp_path


def _again(run_dir, nano_model_dir, fault_data, steps=8, extra=()):
    return invoke_cli(base_args(nano_model_dir, fault_data / "train.parquet", run_dir, steps=steps,
                                extra=[*SAVE, *extra]), run_dir)


def test_missing_tracker_resumes_from_the_newest_complete_checkpoint(run_dir, nano_model_dir, fault_data):
    """Issue 24: without latest_checkpointed_iteration.txt the run started at step 1 and overwrote 2/4/6."""
    root = run_dir / "ckpt"
    (root / ckpt.LATEST_FILE).unlink()
    before = {s: _digest(ckpt.step_dir(root, s)) for s in (2, 4, 6)}
    result = _again(run_dir, nano_model_dir, fault_data)
    assert result.escaped is None and result.rc == 0, result.message
    assert "latest_checkpointed_iteration.txt is missing; resuming from" in result.stderr
    assert "global_step_6" in result.stderr
    steps = [m["training/global_step"] for m in read_metrics(run_dir) if "timing_s/step" in m]
    assert steps == [7.0, 8.0]  # continued, did not start over
    assert {s: _digest(ckpt.step_dir(root, s)) for s in (2, 4, 6)} == before  # nothing overwritten
    assert ckpt.completed_steps(root) == [2, 4, 6, 8]


def test_a_truncated_shard_falls_back_to_the_previous_checkpoint(run_dir, nano_model_dir, fault_data):
    root = run_dir / "ckpt"
    shard = ckpt.step_dir(root, 6) / "actor" / "model_world_size_1_rank_0.pt"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    result = _again(run_dir, nano_model_dir, fault_data, steps=6)
    assert result.escaped is None and result.rc == 0, result.message
    assert str(shard) in result.stderr and "truncated" in result.stderr  # names the bad file
    assert "resuming from" in result.stderr and "global_step_4" in result.stderr
    broken = [p.name for p in root.iterdir() if p.name.startswith("global_step_6.broken-")]
    assert len(broken) == 1  # kept aside, not deleted, not overwritten
    steps = [m["training/global_step"] for m in read_metrics(run_dir) if "timing_s/step" in m]
    assert steps == [5.0, 6.0]


def test_resume_path_at_a_truncated_checkpoint_names_the_file(run_dir, nano_model_dir, fault_data):
    root = run_dir / "ckpt"
    state = ckpt.step_dir(root, 4) / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    result = _again(run_dir, nano_model_dir, fault_data,
                    extra=["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt.step_dir(root, 4)}",
                           "trainer.overwrite_checkpoints=true"])
    assert result.rc == 2 and result.escaped is None
    assert str(state) in result.stderr and "truncated" in result.stderr


def test_an_older_tracker_does_not_overwrite_newer_checkpoints(run_dir, nano_model_dir, fault_data):
    root = run_dir / "ckpt"
    (root / ckpt.LATEST_FILE).write_text("4")
    before = _digest(ckpt.step_dir(root, 6))
    result = _again(run_dir, nano_model_dir, fault_data)
    assert result.rc == 2 and result.escaped is None, result.message
    assert "global_step_6" in result.stderr and "trainer.overwrite_checkpoints=true" in result.stderr
    assert _digest(ckpt.step_dir(root, 6)) == before
    allowed = _again(run_dir, nano_model_dir, fault_data, steps=6, extra=["trainer.overwrite_checkpoints=true"])
    assert allowed.rc == 0, allowed.message
    assert [m["training/global_step"] for m in read_metrics(run_dir) if "timing_s/step" in m] == [5.0, 6.0]


def test_starting_fresh_beside_checkpoints_needs_the_explicit_key(run_dir, nano_model_dir, fault_data):
    result = _again(run_dir, nano_model_dir, fault_data, steps=2, extra=["trainer.resume_mode=disable"])
    assert result.rc == 2 and "starts fresh" in result.stderr and "overwrite_checkpoints" in result.stderr
    fresh = _again(run_dir, nano_model_dir, fault_data, steps=2,
                   extra=["trainer.resume_mode=disable", "trainer.overwrite_checkpoints=true"])
    assert fresh.rc == 0, fresh.message
    no_saves = _again(run_dir, nano_model_dir, fault_data, steps=1,
                      extra=["trainer.resume_mode=disable", "trainer.save_freq=-1"])
    assert no_saves.rc == 0, no_saves.message  # a run that never saves replaces nothing


class _Planted:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _plant(path: Path, marker: Path) -> None:
    """Replace ``path`` with a pickle that runs a command, and update the manifest's size record to match."""
    torch.save({"global_step": 6, "payload": _Planted(str(marker))}, path)
    folder = path.parent if path.name == "trainer_state.pt" else path.parent.parent
    manifest = json.loads((folder / ckpt.MANIFEST_FILE).read_text())
    manifest["files"][str(path.relative_to(folder))] = path.stat().st_size
    (folder / ckpt.MANIFEST_FILE).write_text(json.dumps(manifest))


def test_a_crafted_trainer_state_is_refused_with_its_path(run_dir, nano_model_dir, fault_data, tmp_path):
    marker = tmp_path / "PWNED"
    target = ckpt.step_dir(run_dir / "ckpt", 6) / "trainer_state.pt"
    _plant(target, marker)
    result = _again(run_dir, nano_model_dir, fault_data)
    assert result.rc != 0
    assert f"refusing to load {target}" in result.message and "posix.system" in result.message
    assert not marker.exists()  # the planted command never ran


def test_merge_refuses_a_crafted_shard(run_dir, tmp_path):
    marker = tmp_path / "PWNED"
    shard = ckpt.step_dir(run_dir / "ckpt", 6) / "actor" / "model_world_size_1_rank_0.pt"
    _plant(shard, marker)
    proc = subprocess.run([sys.executable, "-m", "hybridflow", "merge", str(ckpt.step_dir(run_dir / "ckpt", 6)),
                           str(tmp_path / "hf")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode != 0
    assert f"refusing to load {shard}" in proc.stderr, proc.stderr[-2000:]
    assert not marker.exists()


DISK_FULL_DRIVER = r"""
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
from faults.conftest import base_args, invoke_cli
import os, pathlib, shutil
from hybridflow.trainer import run_checkpoint as ckpt
root = pathlib.Path({root!r})
rotate = ckpt.rotate_checkpoints

def fill_after_the_first_save(folder, component, keep):
    removed = rotate(folder, component, keep)
    filler = root / "filler"
    if not filler.exists():  # leave 300 KiB: the next save runs out of space half-way
        with open(filler, "wb") as f:
            f.write(bytes(max(0, shutil.disk_usage(root).free - 300 * 1024)))
    return removed

ckpt.rotate_checkpoints = fill_after_the_first_save
args = base_args({model!r}, pathlib.Path({train!r}), root, steps=4,
                 extra=["trainer.save_freq=1", "trainer.total_epochs=10", "trainer.max_actor_ckpt_to_keep=1"])
result = invoke_cli(args, root)
print("RC", result.rc)
print(result.message[-3000:])
"""


def test_disk_full_during_a_save_says_so_and_keeps_the_previous_checkpoint(tmp_path, nano_model_dir, fault_data):
    """A small tmpfs: once the first checkpoint (1.1 MiB for the nano model) is saved, the driver fills the disk up
    to 300 KiB (in the run's own process, right after that save: no race with the trainer), so the second save runs
    out of space half-way."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"]).returncode != 0:
        pytest.skip("needs user namespaces (unshare -Urm) to mount a small tmpfs without root")
    mount = tmp_path / "small"
    mount.mkdir()
    repo = str(Path(__file__).resolve().parents[2])
    driver = tmp_path / "driver.py"
    driver.write_text(DISK_FULL_DRIVER.format(repo=repo, tests=str(Path(repo) / "tests"), root=str(mount),
                                              model=nano_model_dir, train=str(fault_data / "train.parquet")))
    # the preflight's free-space check would refuse a disk too small for two checkpoints: it is filled after it ran
    script = (f"mount -t tmpfs -o size=16m tmpfs {mount} && {sys.executable} {driver}; "
              f"ls {mount}/ckpt; cat {mount}/ckpt/latest_checkpointed_iteration.txt")
    proc = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": repo})
    out = proc.stdout + proc.stderr
    assert "RC 2" in out, out[-3000:]
    assert "the disk is full" in out and "global_step_1 is kept" in out, out[-3000:]
    listing = out.split("global_step_1", 1)[1] if "global_step_1" in out else ""
    assert ".tmp-" not in listing  # the partial save was removed
