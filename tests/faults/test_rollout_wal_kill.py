"""kill -9 of a fully async run at random points over 20 steps, resumed each time: every sample of the stream is
trained exactly once (the same samples as an uninterrupted run) and the samples the killed runs had generated are
trained with the tokens they were generated with, not generated again (the rollout log, trainer.rollout_wal).

Real processes (``python -m hybridflow.trainer.main_ppo``), the nano model, the hf engine on standalone replicas.
The kill lands after a random number of logged steps (1-5) plus a random delay of 0-300 ms: inside a step, inside
a checkpoint, inside the log's compaction or an append -- wherever the run happens to be.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hybridflow.trainer import run_checkpoint as ckpt
from hybridflow.trainer.durable.wal import read_records

from .conftest import base_args, cli_command, cli_env

A = "actor_rollout_ref"
FULLY = [f"{A}.hybrid_engine=false", "async_training.mode=fully_async", f"{A}.rollout.free_cache_engine=false",
         f"{A}.rollout.calculate_log_probs=true", f"{A}.rollout.agent.num_workers=2", "data.train_batch_size=0",
         "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
         "async_training.partial_rollout=true", "rollout.total_epochs=10", "trainer.save_freq=5",
         "trainer.report=false"]
STEPS = 20


def _args(model, data, out):
    return base_args(model, data / "train.parquet", out, steps=STEPS, extra=FULLY)


def _steps_logged(metrics: Path, start_size: int) -> int:
    if not metrics.exists() or metrics.stat().st_size <= start_size:
        return 0
    with open(metrics, "rb") as f:
        f.seek(start_size)
        return sum(1 for line in f.read().splitlines() if b'"timing_s/step"' in line)


def _run_until_killed(args, cwd: Path, rng: random.Random | None) -> tuple[int | None, str]:
    """Start the run; kill -9 it after 1-5 new logged steps and 0-300 ms (``rng`` None: never). The return code
    when it ended by itself, with the end of its stderr."""
    metrics = cwd / "outputs" / "faults" / "run" / "metrics.jsonl"
    start = metrics.stat().st_size if metrics.exists() else 0
    after, delay = (rng.randint(1, 5), rng.uniform(0.0, 0.3)) if rng is not None else (STEPS + 1, 0.0)
    err_path = cwd / "stderr.txt"
    with open(err_path, "w") as err:  # a file, not a pipe: a pipe nobody reads fills up and blocks the run
        proc = subprocess.Popen(cli_command(args), cwd=cwd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            if _steps_logged(metrics, start) >= after:
                time.sleep(delay)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    return None, f"after {after} steps + {delay * 1000:.0f} ms"
            time.sleep(0.01)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err_path.read_text()[-3000:]


def _trained(root: Path) -> dict[int, list[str]]:
    """ordinal -> digests of every time the final checkpoint's history trained it."""
    out: dict[int, list[str]] = {}
    for step in ckpt.completed_steps(root):
        for _, _, ids, digests in ckpt.load_data_state(ckpt.step_dir(root, step))["rollout_log"]["trained"]:
            for o, d in zip(ids, digests):
                out.setdefault(o, []).append(d)
    return out


def _logged_beyond_checkpoint(root: Path) -> dict[int, str]:
    """The samples the killed run's log holds that its last complete checkpoint had not trained."""
    from hybridflow.trainer.durable.codec import decode
    from hybridflow.trainer.durable.rollout_log import sample_digest

    done = _trained(root)
    records = read_records(root / "rollout_wal" / "fully_async.log")
    return {r["ordinal"]: sample_digest(decode(r["outputs"])) for r in records
            if r.get("kind") == "sample" and r["ordinal"] not in done}


@pytest.mark.timeout(2400)  # ~3 min alone; a dozen process starts on a loaded 2-core machine take longer
def test_kill_9_at_random_points_loses_no_generated_sample_and_trains_none_twice(fault_data, nano_model_dir,
                                                                                   tmp_path):
    straight_dir, killed_dir = tmp_path / "straight", tmp_path / "killed"
    straight_dir.mkdir(), killed_dir.mkdir()
    rc, err = _run_until_killed(_args(nano_model_dir, fault_data, straight_dir), straight_dir, None)
    assert rc == 0, err
    straight = _trained(straight_dir / "ckpt")
    assert sorted(straight) == list(range(STEPS * 4))

    rng, kills, expected = random.Random(20261128), [], {}
    root = killed_dir / "ckpt"
    for attempt in range(12):
        rc, note = _run_until_killed(_args(nano_model_dir, fault_data, killed_dir), killed_dir, rng)
        if rc is not None:
            assert rc == 0, note
            break
        last = (ckpt.completed_steps(root) or [0])[-1]
        logged = _logged_beyond_checkpoint(root) if (root / "rollout_wal").exists() else {}
        expected.update(logged)
        kills.append({"kill": note, "last_checkpoint": last, "logged_untrained": len(logged),
                      "log_bytes": (root / "rollout_wal" / "fully_async.log").stat().st_size
                      if (root / "rollout_wal" / "fully_async.log").exists() else 0})
    else:
        raise AssertionError(f"the run never finished: {kills}")
    (tmp_path / "kills.json").write_text(json.dumps(kills, indent=1))
    print(json.dumps(kills))
    assert len(kills) >= 3, kills
    trained = _trained(root)
    assert all(len(d) == 1 for d in trained.values()), {o: d for o, d in trained.items() if len(d) > 1}
    assert sorted(trained) == sorted(straight)  # the uninterrupted run's samples, each once
    assert expected, "no kill left a generated-but-untrained sample in the log: the test proves nothing"
    # every sample a killed run had generated and not yet trained was trained with the tokens it was generated with
    assert {o: trained[o][0] for o in expected} == expected
    restored = [json.loads(line).get("rollout_wal/restored_samples", 0) for line in
                (killed_dir / "outputs" / "faults" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum(restored) > 0
    shutil.rmtree(killed_dir / "outputs", ignore_errors=True)
