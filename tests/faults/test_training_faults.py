"""Faults during training that the run must survive or end cleanly: prompt truncation, non-finite gradients,
SIGINT/SIGTERM (misbehaving reward functions and agent loops: ``test_silent_runs.py``). See docs/reliability.md
for the table these keep true."""

from __future__ import annotations

import signal
from pathlib import Path

import pandas as pd
import pytest

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import A, base_args, invoke_cli, read_metrics, run_cli_subprocess

REWARDS = Path(__file__).with_name("faulty_rewards.py")


def _steps(metrics):
    return [m for m in metrics if "timing_s/step" in m]


# ------------------------------------------------------------------------------------------------ truncation
@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_overlong_prompts_are_cut_under_each_truncation_mode(mode, tmp_path, fault_data, nano_model_dir):
    df = pd.read_parquet(fault_data / "train.parquet")
    df["prompt"] = [[{"role": "user", "content": f"{i}+" * 30 + "="}] for i in range(len(df))]
    df.to_parquet(tmp_path / "long.parquet")
    result = invoke_cli(base_args(nano_model_dir, tmp_path / "long.parquet", tmp_path,
                                  extra=[f"data.truncation={mode}"]), tmp_path)
    assert result.escaped is None and result.rc == 0, result.message
    (step,) = _steps(read_metrics(tmp_path))
    assert step["prompt_length/max"] == 32.0  # data.max_prompt_length


def test_overlong_prompts_are_filtered_and_counted(tmp_path, fault_data, nano_model_dir):
    df = pd.read_parquet(fault_data / "train.parquet")
    df.loc[:7, "prompt"] = pd.Series([[{"role": "user", "content": "9+" * 40}] for _ in range(8)])
    df.to_parquet(tmp_path / "mixed.parquet")
    result = invoke_cli(base_args(nano_model_dir, tmp_path / "mixed.parquet", tmp_path,
                                  extra=["data.filter_overlong_prompts=true"]), tmp_path)
    assert result.escaped is None and result.rc == 0, result.message
    reported = [ln for ln in result.stderr.splitlines() if "filter_overlong_prompts" in ln]
    assert reported and "8" in reported[0] and "max_prompt_length" in reported[0]  # reported, with its count
    assert len(_steps(read_metrics(tmp_path))) == 1  # the 8 short rows still train


# ------------------------------------------------------------------------------------------------ non-finite
# entropy_coeff=1e38 makes the loss -inf and the gradient norm inf on every step: the optimizer step is skipped.
NONFINITE = [f"{A}.actor.entropy_coeff=1e38"]


def test_nonfinite_gradients_skip_the_step_and_training_continues(tmp_path, fault_data, nano_model_dir):
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=3,
                     extra=[*NONFINITE, f"{A}.actor.max_consecutive_skipped_steps=0"])
    result = invoke_cli(args, tmp_path)
    assert result.escaped is None and result.rc == 0, result.message
    steps = _steps(read_metrics(tmp_path))
    assert [s["training/global_step"] for s in steps] == [1.0, 2.0, 3.0]
    assert all(s["actor/nonfinite_grad_skipped"] == 1.0 for s in steps)


def test_skipped_steps_are_reported_as_training_skipped_steps(tmp_path, fault_data, nano_model_dir):
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=2,
                     extra=[*NONFINITE, f"{A}.actor.max_consecutive_skipped_steps=0"])
    assert invoke_cli(args, tmp_path).rc == 0
    assert [s["training/skipped_steps"] for s in _steps(read_metrics(tmp_path))] == [1.0, 2.0]


def test_too_many_nonfinite_steps_in_a_row_abort_with_the_key_to_raise(tmp_path, fault_data, nano_model_dir):
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=4,
                     extra=[*NONFINITE, f"{A}.actor.max_consecutive_skipped_steps=2"])
    result = invoke_cli(args, tmp_path)
    assert result.rc != 0
    assert "max_consecutive_skipped_steps" in result.message and "2 optimizer steps in a row" in result.message
    assert len(_steps(read_metrics(tmp_path))) == 1  # step 1 skipped and logged, step 2 hit the limit


# ------------------------------------------------------------------------------------------------ interrupts
@pytest.mark.parametrize("fn,code", [("sends_sigterm", 143), ("sends_sigint", 130)])
def test_signal_mid_step_finishes_the_step_saves_and_reports(fn, code, tmp_path, fault_data, nano_model_dir):
    """The real trainer under ``GracefulInterrupt``: the signal lands inside step 1's reward stage."""
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo
    from hybridflow.trainer.signals import GracefulInterrupt

    fresh = tmp_path / "rewards.py"  # its own module, so its "signal once" flag is fresh in every test
    fresh.write_text(REWARDS.read_text())
    cfg = load_config(base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=5,
                                extra=[f"custom_reward_function.path={fresh}", f"custom_reward_function.name={fn}",
                                       "trainer.save_freq=100"]))
    logger = Tracking("faults", "run", default_backend=["file"], output_dir=tmp_path / "logs")
    before = signal.getsignal(signal.SIGTERM)  # another test's ray.init may have installed its own handler
    with GracefulInterrupt() as interrupt:
        history = train_ppo(cfg, logger=logger, should_stop=interrupt.should_stop)
    assert interrupt.exit_code == code
    assert [m["step"] for m in history.metrics if "timing_s/step" in m] == [1]  # the step finished, no more ran
    assert ckpt.completed_steps(tmp_path / "ckpt") == [1]  # saved although save_freq=100
    assert (tmp_path / "logs" / "metrics.jsonl").exists()
    assert any(p.name.startswith("report") for p in (tmp_path / "logs").iterdir())
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_sigterm_to_the_cli_exits_143_with_a_checkpoint(tmp_path, fault_data, nano_model_dir):
    args = base_args(nano_model_dir, fault_data / "train.parquet", tmp_path, steps=5,
                     extra=[f"custom_reward_function.path={REWARDS}", "custom_reward_function.name=sends_sigterm",
                            "trainer.save_freq=100"])
    proc = run_cli_subprocess(args, tmp_path)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert ckpt.completed_steps(tmp_path / "ckpt") == [1]
