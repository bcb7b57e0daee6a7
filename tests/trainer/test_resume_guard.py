"""A run that does nothing is an error (trainer/resume_guard.py), with fake worker groups: a resumed run that trains
zero steps while steps remain, one that would start from step 0 while checkpoints exist, and a loader exhausted
before ``total_training_steps``. The real-run version is tests/integration/test_drift_runs.py's resume test."""

from __future__ import annotations

import pytest
import torch

from hybridflow.launch.config import load_config
from hybridflow.trainer import run_checkpoint as ckpt
from hybridflow.trainer.controller import RLController
from hybridflow.trainer.resume_guard import RunDidNothingError
from hybridflow.trainer.stages import WorkerGroups
from fake_groups import TOKENIZER, FakeActor, FakeLoader, FakeRollout, Recorder, config_overrides, prompts, \
    reward_first_token_zero


def build(tmp_path, steps, batches, extra=()):
    cfg = load_config([*config_overrides(tmp_path, n=2, b=2, steps=steps, mini=2), "algorithm.adv_estimator=grpo",
                       "trainer.total_epochs=1", *extra])
    rec = Recorder()
    actor = FakeActor(rec)
    loader = FakeLoader([prompts(2, start=100 * i) for i in range(batches)], batch_size=2)
    groups = WorkerGroups(actor_rollout=actor, ref=actor, rollout=FakeRollout(rec, 2))
    return RLController(cfg, TOKENIZER, groups, loader, None, reward_first_token_zero, reward_first_token_zero), rec


def test_a_loader_exhausted_before_total_training_steps_is_an_error(tmp_path):
    run, rec = build(tmp_path, steps=5, batches=2)
    with pytest.raises(RunDidNothingError, match=r"data ran out at step 2 of trainer.total_training_steps=5: the run "
                                                 r"trained 2 step\(s\).*raise trainer.total_epochs"):
        run.fit()
    assert rec.calls.count("update_actor") == 2


def test_a_resumed_run_that_trains_nothing_while_steps_remain_is_an_error(tmp_path):
    first, _ = build(tmp_path, steps=2, batches=2, extra=["trainer.save_freq=1"])
    first.fit()
    # the same data, asked for two more steps: the loader resumes after its last batch of its only epoch
    resumed, rec = build(tmp_path, steps=4, batches=2, extra=["trainer.save_freq=1"])
    with pytest.raises(RunDidNothingError, match="the resumed run trained no step"):
        resumed.fit()
    assert "load_checkpoint" in rec.calls and "update_actor" not in rec.calls


def test_a_resume_that_starts_from_step_0_while_checkpoints_exist_is_an_error(tmp_path):
    first, _ = build(tmp_path, steps=2, batches=4, extra=["trainer.save_freq=1"])
    first.fit()
    # a checkpoint whose trainer state says step 0 (the restore does not take): the run would start over on top
    folder = ckpt.step_dir(tmp_path / "ckpt", 2)
    state = torch.load(folder / ckpt.TRAINER_STATE_FILE, weights_only=False)
    torch.save({**state, "global_step": 0}, folder / ckpt.TRAINER_STATE_FILE)
    resumed, rec = build(tmp_path, steps=4, batches=4, extra=["trainer.save_freq=1"])
    with pytest.raises(RunDidNothingError, match=r"trainer.resume_mode=auto with checkpoints \(steps \[1, 2\]"):
        resumed.fit()
    assert "update_actor" not in rec.calls


def test_a_run_that_finished_its_steps_and_resumes_has_nothing_left_and_is_fine(tmp_path):
    first, _ = build(tmp_path, steps=2, batches=2, extra=["trainer.save_freq=1"])
    first.fit()
    again, rec = build(tmp_path, steps=2, batches=2, extra=["trainer.save_freq=1"])
    again.fit()  # nothing remains: no error, nothing trained
    assert again.global_steps == 2 and "update_actor" not in rec.calls


def test_should_stop_ends_a_run_early_without_an_error(tmp_path):
    run, _ = build(tmp_path, steps=5, batches=5)
    run.fit(should_stop=lambda: True)
    assert run.global_steps == 1
