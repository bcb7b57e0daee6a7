"""A Ray run as a user starts it: the console has hybridflow's lines, not Ray's start-up notices, and a SIGTERM
ends it the way it ends a local run (the step finishes, checkpoint, exit 143) -- not with Ray's register dump and
an abort (exit 134), which is what Ray's C++ failure signal handler did in the driver."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import base_args, run_cli_subprocess

REWARDS = Path(__file__).with_name("faulty_rewards.py")
RAY_NOTICES = ("SIGTERM handler is not set", "Token authentication is enabled", "Started a local Ray instance")


@pytest.mark.slow
@pytest.mark.ray
def test_a_ray_run_prints_hybridflows_lines_and_a_sigterm_ends_it_gracefully(tmp_path, fault_data, nano_model_dir):
    # the reward function sends SIGTERM to the driver during step 1 (scored in the driver: no reward loop, in-process)
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=5, backend="ray",
                     extra=[f"custom_reward_function.path={REWARDS}", "custom_reward_function.name=sends_sigterm",
                            "reward_model.use_reward_loop=false", "trainer.save_freq=100"])
    proc = run_cli_subprocess(args, tmp_path, timeout=240)
    assert proc.returncode == 143, proc.stderr[-3000:]
    assert ckpt.completed_steps(tmp_path / "ckpt") == [1]
    assert "hybridflow: started a private Ray instance" in proc.stderr
    assert "hybridflow: SIGTERM received: finishing the current step" in proc.stderr
    assert "SIGTERM received at time" not in proc.stderr  # Ray's failure-handler dump
    for notice in RAY_NOTICES:
        assert notice not in proc.stderr, notice
