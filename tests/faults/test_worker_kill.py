"""A Ray worker process killed mid-step: the controller names the role and rank that died, the last complete
checkpoint is intact, and ``resume_mode=auto`` continues from it with the same results as a run that was
never interrupted (the reference run is on the local backend, which matches Ray metric for metric)."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import base_args, cli_command, cli_env, invoke_cli, read_metrics

SAVE_EVERY_STEP = ["trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=3", "ray_kwargs.ray_init.num_cpus=2"]
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


def _stable_steps(metrics):
    return {int(m["training/global_step"]): {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
            for m in metrics if "timing_s/step" in m}


def _ray_workers(pid: int) -> list[psutil.Process]:
    """Ray actor processes this run started (descendants of its driver named ``ray::<Class>...``)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if title.startswith("ray::") and "IDLE" not in title:
            found.append(child)
    return found


@pytest.mark.slow
def test_killed_ray_worker_is_named_and_auto_resume_matches_uninterrupted(tmp_path, fault_data, nano_model_dir):
    train = fault_data / "train.parquet"
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "killed"
    ref_dir.mkdir()
    run_dir.mkdir()
    reference = invoke_cli(base_args(nano_model_dir, train, ref_dir, steps=4, extra=SAVE_EVERY_STEP), ref_dir)
    assert reference.rc == 0, reference.message

    root = run_dir / "ckpt"
    proc = subprocess.Popen(cli_command(base_args(nano_model_dir, train, run_dir, steps=4, backend="ray",
                                                  extra=SAVE_EVERY_STEP)),
                            cwd=run_dir, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    killed = []
    try:
        end = time.monotonic() + 150
        while time.monotonic() < end and proc.poll() is None and not killed:
            if 2 in ckpt.completed_steps(root):
                for worker in _ray_workers(proc.pid):
                    worker.kill()
                    killed.append(worker.pid)
            time.sleep(0.01)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, "no Ray worker was found to kill (did the run finish before step 2 was saved?)"
    assert proc.returncode not in (0, None)
    last = [ln for ln in stderr.splitlines() if ln.strip()]
    report = "\n".join(last[-40:])
    # killing every Ray process of the run can take the node's agents and so its raylet down: then the run names
    # the lost node ("Lost Ray node ...: Rank 0 of worker group ... died"), else the dead worker
    assert "died" in report and "rank 0" in report.lower() and "worker group" in report, report

    complete = ckpt.completed_steps(root)
    assert complete and 2 <= complete[-1] < 4
    start = complete[-1]
    assert ckpt.find_resume_dir(root, "auto", None) == ckpt.step_dir(root, start)

    resumed = invoke_cli(base_args(nano_model_dir, train, run_dir, steps=4, extra=SAVE_EVERY_STEP), run_dir)
    assert resumed.escaped is None and resumed.rc == 0, resumed.message
    expected, got = _stable_steps(read_metrics(ref_dir)), _stable_steps(read_metrics(run_dir))
    for step in range(start + 1, 5):
        assert expected[step].keys() == got[step].keys()
        for key, value in expected[step].items():
            assert got[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)
