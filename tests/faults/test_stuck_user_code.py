"""Signals always work: SIGTERM stops a run within seconds even while a reward function is stuck forever.

The known bug: with ``reward_model.num_workers=0`` (scoring in the trainer's process) a reward function that
sleeps forever hung the run through three SIGTERMs and a SIGINT for 11 minutes -- the stuck scoring thread was
joined at exit.  Now an in-process scorer runs in a daemon thread with ``reward_model.timeout_s``, and after a
stop request a scorer still stuck a few seconds later abandons the step (exit 143, the last checkpoint kept).
The real CLI runs as a subprocess; the reward function stamps when it is entered, and the test signals then.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import base_args, cli_command, cli_env

REWARDS = Path(__file__).resolve().parent / "faulty_rewards.py"
STUCK = [f"custom_reward_function.path={REWARDS}", "custom_reward_function.name=hangs_forever",
         "reward_model.num_workers=0", "reward_model.timeout_s=600"]


def _start(tmp_path, nano_model_dir, fault_data, backend="local", extra=()):
    stamp = tmp_path / "reward_entered"
    env = cli_env()
    env["HYBRIDFLOW_REWARD_STAMP"] = str(stamp)
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=2, backend=backend,
                     extra=[*STUCK, "trainer.save_freq=1", *extra])
    proc = subprocess.Popen(cli_command(args), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not stamp.exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the reward function was never called"
        time.sleep(0.1)
    time.sleep(0.5)  # well inside the call
    return proc


def _wait(proc, timeout=120):
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the run did not stop within {timeout} s of the signal:\n{err[-3000:]}")
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("reward_loop", ["true", "false"])
def test_one_sigterm_stops_a_run_stuck_in_an_in_process_reward_within_seconds(reward_loop, tmp_path, nano_model_dir,
                                                                             fault_data):
    proc = _start(tmp_path, nano_model_dir, fault_data, extra=[f"reward_model.use_reward_loop={reward_loop}"])
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, err = _wait(proc)
    took = time.monotonic() - signalled
    print(f"reward_loop={reward_loop}: exit {code} {took:.1f} s after SIGTERM")
    assert code == 143, err[-3000:]
    assert "SIGTERM received" in err and "the reward function has not answered" in err
    assert "abandoning the current step" in err
    assert took < 15
    assert not (tmp_path / "ckpt" / "global_step_1").exists()  # the stuck step was not saved as complete


@pytest.mark.slow
def test_a_second_sigterm_stops_a_ray_run_stuck_in_a_reward_within_seconds(tmp_path, nano_model_dir, fault_data):
    """On Ray the stuck scorer is another process: the first SIGTERM waits for it (reward_model.timeout_s), the
    second abandons the step at once -- it used to abort the driver (exit 134, Ray's C++ crash handler)."""
    proc = _start(tmp_path, nano_model_dir, fault_data, backend="ray", extra=["ray_kwargs.ray_init.num_cpus=2"])
    proc.send_signal(signal.SIGTERM)
    time.sleep(2)
    assert proc.poll() is None  # the first signal lets the step finish (it cannot: the scorer is stuck)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, err = _wait(proc)
    took = time.monotonic() - signalled
    print(f"ray: exit {code} {took:.1f} s after the second SIGTERM")
    assert code == 143, err[-3000:]
    assert "second SIGTERM: abandoning the current step" in err
    assert took < 30
