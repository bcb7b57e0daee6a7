"""Killing the process (SIGKILL, no clean-up code runs) while a checkpoint is being written never leaves a
checkpoint that resume would pick up half-written; ``resume_mode=auto`` continues from the last complete one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import base_args, cli_command, cli_env, invoke_cli, read_metrics

TMP_RE = re.compile(r"^global_step_(\d+)\.tmp-")


def _kill_during_a_save(proc: subprocess.Popen, root, min_step: int, deadline_s: float) -> str | None:
    """Poll for an in-progress save (a ``global_step_N.tmp-*`` folder) and SIGKILL the run while it exists."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and proc.poll() is None:
        if root.is_dir():
            for name in os.listdir(root):
                m = TMP_RE.match(name)
                if m and int(m.group(1)) >= min_step:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return name
        time.sleep(0.0005)
    return None


def test_sigkill_during_checkpoint_save_keeps_last_complete_checkpoint(tmp_path, fault_data, nano_model_dir):
    root = tmp_path / "ckpt"
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=12,
                     extra=["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2", "trainer.total_epochs=10"])
    proc = subprocess.Popen(cli_command(args), cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        caught = _kill_during_a_save(proc, root, min_step=2, deadline_s=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert caught is not None, "the run finished before a save could be interrupted (saves got too fast to see?)"
    interrupted_step = int(TMP_RE.match(caught).group(1))

    # What resume sees: only complete (manifest-bearing) steps, and `latest` names one of them.
    complete = ckpt.completed_steps(root)
    assert interrupted_step not in complete and complete and complete[-1] == interrupted_step - 1
    latest = ckpt.find_resume_dir(root, "auto", None)
    assert latest == ckpt.step_dir(root, interrupted_step - 1)
    assert ckpt.read_manifest(latest)["global_step"] == interrupted_step - 1

    # resume_mode=auto (the default) continues from it, and the crash's temp folder is cleaned up.
    resumed = invoke_cli(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path,
                                   steps=interrupted_step + 1,
                                   extra=["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2",
                                          "trainer.total_epochs=10"]), tmp_path)
    assert resumed.escaped is None and resumed.rc == 0, resumed.message
    steps = [m["training/global_step"] for m in read_metrics(tmp_path) if "timing_s/step" in m]
    assert steps[-2:] == [float(interrupted_step), float(interrupted_step + 1)]
    assert not any(TMP_RE.match(n) for n in os.listdir(root))
    assert ckpt.completed_steps(root) == [interrupted_step, interrupted_step + 1]
