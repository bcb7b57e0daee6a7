"""The example scripts: every one composes a valid config, and the GRPO one trains through the shell path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = sorted(p.name for p in EXAMPLES.glob("run_tiny_*.sh"))


def _env(model_dir, data_dir, workdir):
    env = dict(os.environ, PYTHON=sys.executable, WORKDIR=str(workdir), MODEL_PATH=str(model_dir),
               DATA_DIR=str(data_dir), OMP_NUM_THREADS="1")
    return env


def test_every_algorithm_has_an_example():
    names = {n[len("run_tiny_"):-3] for n in TINY}
    assert {"ppo_gae", "grpo", "rloo", "reinforce_plus_plus", "remax", "drgrpo", "gspo", "dapo"} <= names
    assert (EXAMPLES / "run_gsm8k_grpo.sh").is_file()


def _script_overrides(script, env, tmp_path):
    """The overrides a script passes to main_ppo, captured by a stand-in interpreter (no Python start-up)."""
    stub = tmp_path / "print_args.sh"
    stub.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@"\n')
    stub.chmod(0o755)
    out = subprocess.run(["bash", str(EXAMPLES / script)], env={**env, "PYTHON": str(stub)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    args = [a for a in out.stdout.split("\0") if a]
    assert args[:2] == ["-m", "hybridflow.trainer.main_ppo"], args[:3]
    return args[2:]


@pytest.mark.parametrize("script", TINY)
def test_example_config_is_valid(script, nano_model_dir, addition_data, tmp_path):
    from hybridflow.config import parse_command_line
    from hybridflow.launch.config import load_config

    cl = parse_command_line(_script_overrides(script, _env(nano_model_dir, addition_data, tmp_path), tmp_path))
    cfg = load_config(cl.overrides)
    assert cfg.actor_rollout_ref.model.path == str(nano_model_dir)
    assert cfg.actor_rollout_ref.rollout.name == "hf"


@pytest.mark.slow
def test_gsm8k_example_prepares_data_and_validates(bpe_model_dir, gsm8k_dir, tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, MODEL_PATH=str(bpe_model_dir), DATA_DIR=str(tmp_path / "gsm8k"),
               GSM8K_INPUT=str(gsm8k_dir), BACKEND="local", DEVICE="cpu")
    out = subprocess.run(["bash", str(EXAMPLES / "run_gsm8k_grpo.sh"), "--dry-run"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "gsm8k" / "train.parquet").is_file()


@pytest.mark.slow
def test_grpo_example_trains_two_steps(nano_model_dir, addition_data, tmp_path):
    args = ["trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.test_freq=-1",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", "trainer.logger=[console]", "trainer.report=false"]
    out = subprocess.run(["bash", str(EXAMPLES / "run_tiny_grpo.sh"), *args], env=_env(nano_model_dir, addition_data, tmp_path),
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
