"""trainer.async_validation: validation runs beside training against the weights of the step it was due at, its
metrics land at that step, and no weight push happens while it runs (fake worker groups, no timing)."""

from __future__ import annotations

import threading

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config
from hybridflow.trainer.validation import ValidationResult
from fake_groups import FakeActor, FakeLoader, FakeStreamManager, Recorder, TOKENIZER, config_overrides, prompts
from fake_groups import reward_first_token_zero

A = "actor_rollout_ref"
FULLY = [f"{A}.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
         f"{A}.rollout.free_cache_engine=false", "async_training.mode=fully_async",
         f"{A}.rollout.calculate_log_probs=true", "async_training.require_batches=1",
         "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
         "rollout.test_freq=2"]


class SignallingActor(FakeActor):
    def __init__(self, rec):
        super().__init__(rec)
        self.updated = threading.Condition()
        self.updates = 0

    def update_actor(self, batch):
        out = super().update_actor(batch)
        with self.updated:
            self.updates += 1
            self.updated.notify_all()
        return out


class WatchingValidator:
    """Validates 'step N' by waiting until training has gone on to the next update (proof that training did not
    wait for it), then watching the fleet for 2 s: a weight push in that window would change the weights under it."""

    def __init__(self, actor, fleet):
        self.actor, self.fleet = actor, fleet
        self.seen: list[dict] = []

    def run(self, step):
        pushes = self.fleet.pushes
        with self.actor.updated:
            overlapped = self.actor.updated.wait_for(lambda: self.actor.updates > step, timeout=10)
        with self.actor.updated:
            self.actor.updated.wait_for(lambda: self.fleet.pushes != pushes, timeout=2)
        self.seen.append({"step": step, "overlapped": overlapped, "pushed_under_it": self.fleet.pushes != pushes})
        return ValidationResult({"val-core/fake/acc/mean@1": float(step)}, [])


def _run(tmp_path, extra=()):
    from hybridflow.trainer.controller import RLController
    from hybridflow.trainer.stages import WorkerGroups

    cfg = load_config([*config_overrides(tmp_path, n=2, b=2, steps=4, mini=2), "algorithm.adv_estimator=grpo",
                       *FULLY, *extra])
    rec = Recorder()
    actor = SignallingActor(rec)
    rollout = FakeStreamManager(rec, cfg.actor_rollout_ref.rollout)
    loader = FakeLoader([prompts(2, start=100 * i) for i in range(6)], batch_size=2)
    run = RLController(cfg, TOKENIZER, WorkerGroups(actor_rollout=actor, ref=actor, rollout=rollout), loader, None,
                       reward_first_token_zero, reward_first_token_zero)
    return run, actor, rollout.fleet


def test_validation_runs_beside_training_and_is_logged_at_its_step(tmp_path, monkeypatch):
    import hybridflow.trainer.modes.fully_async as fully_async
    from hybridflow.trainer.background_validation import BackgroundValidation

    monkeypatch.setattr(fully_async, "separate_validation_rollout", lambda run: None)  # the fake validator's own
    run, actor, fleet = _run(tmp_path, ["trainer.async_validation=true"])
    run.validator = validator = WatchingValidator(actor, fleet)
    run.background_validation = BackgroundValidation(run._validate_step)
    history = run.fit()
    # due after step 2 and after the last step (4); the last one only ends when... there is no next update
    assert [v["step"] for v in validator.seen] == [2, 4]
    assert validator.seen[0]["overlapped"]  # step 3 trained while step 2's weights were validated
    assert not any(v["pushed_under_it"] for v in validator.seen)  # the push after step 3 waited for it
    val_rows = [m for m in history.metrics if "val-core/fake/acc/mean@1" in m]
    assert [(m["step"], m["val-core/fake/acc/mean@1"]) for m in val_rows] == [(2, 2.0), (4, 4.0)]
    steps = [m for m in history.metrics if "training/global_step" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    assert all("val-core/fake/acc/mean@1" not in m for m in steps)  # validation rows are their own, at its step
    assert "timing_s/testing_wait" in steps[2] and all(m["timing_s/testing_background"] > 0 for m in val_rows)


def test_in_line_validation_is_unchanged_by_default(tmp_path, monkeypatch):
    import hybridflow.trainer.modes.fully_async as fully_async

    monkeypatch.setattr(fully_async, "separate_validation_rollout", lambda run: None)
    run, actor, fleet = _run(tmp_path)
    run.validator = validator = WatchingValidator(actor, fleet)
    assert run.background_validation is None
    history = run.fit()
    assert not validator.seen[0]["overlapped"]  # training waited: the next update came only after it
    rows = [m for m in history.metrics if "val-core/fake/acc/mean@1" in m]
    assert [m["step"] for m in rows] == [2, 4] and all("training/global_step" in m for m in rows)


def test_modes_that_cannot_validate_in_the_background_refuse_the_key(tmp_path):
    with pytest.raises(ConfigError, match="trainer.async_validation=true.*this run is sync"):
        load_config([*config_overrides(tmp_path, n=2, b=2, steps=4, mini=2), "trainer.async_validation=true"])
    with pytest.raises(ConfigError, match="this run is one_step_off"):
        load_config([*config_overrides(tmp_path, n=2, b=2, steps=4, mini=2), "trainer.async_validation=true",
                     *FULLY[:4], "async_training.mode=one_step_off"])
