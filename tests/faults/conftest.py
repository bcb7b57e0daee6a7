"""Shared pieces of the fault suite: tiny data on disk, a small verl command line, and ways to run the CLI."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
A = "actor_rollout_ref"


@pytest.fixture(scope="session")
def fault_data(tmp_path_factory):
    """16 train / 8 test prompts of the built-in addition task (2 steps of 8 per epoch)."""
    from hybridflow.data.synthetic import write_synthetic

    d = tmp_path_factory.mktemp("fault_data")
    write_synthetic("addition", str(d), train_size=16, test_size=8, seed=0)
    return d


def base_args(model_dir, train_file, out_dir, steps=1, backend="local", extra=()):
    """A ~1 s/step GRPO run: 4 prompts x 2 samples, 4-token answers, fp32 on CPU, file logger only."""
    return [
        f"{A}.model.path={model_dir}", f"critic.model.path={model_dir}", f"data.train_files={train_file}",
        "data.val_files=null", "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=4",
        f"{A}.rollout.name=hf", f"{A}.rollout.n=2", f"{A}.actor.ppo_mini_batch_size=4",
        f"{A}.actor.ppo_micro_batch_size_per_gpu=8", f"{A}.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"{A}.ref.log_prob_micro_batch_size_per_gpu=8", f"{A}.model.enable_gradient_checkpointing=false",
        "algorithm.adv_estimator=grpo", "reward_model.num_workers=0", f"trainer.backend={backend}",
        "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=[file]", "trainer.report=true",
        f"trainer.default_local_dir={Path(out_dir) / 'ckpt'}", "trainer.project_name=faults",
        "trainer.experiment_name=run", "trainer.seed=1", *extra,
    ]


def metrics_file(cwd) -> Path:
    """Where ``trainer.logger=[file]`` writes for ``base_args`` (relative to the run's working folder)."""
    return Path(cwd) / "outputs" / "faults" / "run" / "metrics.jsonl"


def read_metrics(cwd) -> list[dict]:
    path = metrics_file(cwd)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


@dataclass
class CliResult:
    rc: int
    stderr: str
    escaped: BaseException | None  # an exception the CLI let out (printed as a traceback by Python)

    @property
    def message(self) -> str:
        """What the user reads: the escaped exception (Python prints it last), else the CLI's stderr."""
        if self.escaped is not None:
            return f"{type(self.escaped).__name__}: {self.escaped}"
        return self.stderr


def invoke_cli(argv, cwd) -> CliResult:
    """``hybridflow train ARGV`` in this process (no interpreter start-up per case), from folder ``cwd``."""
    from hybridflow.cli import main

    err = io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err):
            try:
                rc, escaped = int(main(["train", *argv]) or 0), None
            except SystemExit as e:
                rc, escaped = int(e.code or 0), None
            except Exception as e:  # noqa: BLE001 - the point is to see what escapes
                rc, escaped = 1, e
    finally:
        os.chdir(old)
    return CliResult(rc, err.getvalue(), escaped)


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def cli_command(argv) -> list[str]:
    return [sys.executable, "-m", "hybridflow.trainer.main_ppo", *argv]


def run_cli_subprocess(argv, cwd, timeout=120) -> subprocess.CompletedProcess:
    """The real entry point as a user runs it: ``python -m hybridflow.trainer.main_ppo ARGV``."""
    return subprocess.run(cli_command(argv), cwd=cwd, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)
