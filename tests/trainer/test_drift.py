"""The drift detector (trainer/drift.py) with fake worker groups: its keys, its levels per engine x dtype, which rows
it judges, warn vs stop, the stop before the update, and the causes it names. Real injected faults on real runs:
tests/integration/test_drift_runs.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.trainer.controller import RLController
from hybridflow.trainer.drift import DriftError, DriftMonitor
from hybridflow.trainer.drift_causes import fresh_rows
from hybridflow.trainer.drift_levels import MEASURED_LEVELS, levels_for, regime_of
from hybridflow.trainer.stages import WorkerGroups
from fake_groups import P, R, TOKENIZER, FakeActor, FakeRollout, Recorder, config_overrides, prompts, \
    reward_first_token_zero

A = "actor_rollout_ref"


def _config(tmp_path, extra=(), mini=2):
    return load_config([*config_overrides(tmp_path, n=2, b=2, steps=2, mini=mini), "algorithm.adv_estimator=grpo",
                        *extra])


class DriftingActor(FakeActor):
    """A trainer whose log-probs differ from the rollout's by ``offsets`` (per response position)."""

    def __init__(self, rec, offsets):
        super().__init__(rec)
        self.offsets = torch.as_tensor(offsets, dtype=torch.float32)

    def drift(self, batch):
        return self.offsets.expand_as(batch.batch["rollout_log_probs"])


def build(tmp_path, offsets=(0.0, 0.0), extra=(), mini=2, raw_prompt_ids=None):
    cfg = _config(tmp_path, extra, mini)
    rec = Recorder()
    actor = DriftingActor(rec, offsets)
    batches = []
    for i in range(4):
        p = prompts(2, start=100 * i)
        if raw_prompt_ids is not None:
            p["raw_prompt_ids"] = np.array([raw_prompt_ids(row) for row in p["input_ids"].tolist()], dtype=object)
        batches.append(p)
    groups = WorkerGroups(actor_rollout=actor, ref=actor, rollout=FakeRollout(rec, 2, log_probs=True))
    return RLController(cfg, TOKENIZER, groups, batches, None, reward_first_token_zero, reward_first_token_zero), rec


# ---------------------------------------------------------------------------------------------- keys and levels
def test_the_detector_is_on_by_default_and_stops(tmp_path):
    drift = _config(tmp_path).trainer.drift
    assert drift.enable and drift.action == "stop" and drift.warn is None and drift.stop is None


@pytest.mark.parametrize("keys,message", [
    (["trainer.drift.action=ignore"], "trainer.drift.action='ignore': choose one of stop, warn"),
    (["trainer.drift.warn=-0.1"], r"trainer.drift.warn=-0.1: give a probability gap in \[0, 1\)"),
    (["trainer.drift.stop=1.5"], "trainer.drift.stop=1.5 can never be reached"),
    (["trainer.drift.warn=0.01", "trainer.drift.stop=0.001"], "trainer.drift.stop=0.001 is below trainer.drift.warn"),
])
def test_meaningless_drift_keys_are_refused_at_config_time(tmp_path, keys, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, keys)


@pytest.mark.parametrize("keys,regime", [
    ([], ("hf", "fp32", False)),
    ([f"{A}.rollout.exact_log_probs=true", f"{A}.rollout.calculate_log_probs=true"], ("hf", "fp32", True)),
    ([f"{A}.rollout.name=vllm", f"{A}.rollout.dtype=float32"], ("vllm", "fp32", False)),
    ([f"{A}.rollout.name=vllm"], ("vllm", "bf16", False)),  # vLLM's default dtype is bfloat16, even on CPU
])
def test_levels_follow_the_engine_and_dtype(tmp_path, keys, regime):
    cfg = _config(tmp_path, keys)
    assert regime_of(cfg) == regime
    levels = levels_for(cfg)
    assert (levels.warn, levels.stop) == MEASURED_LEVELS[regime]
    assert levels.warn < levels.stop


def test_user_levels_replace_the_measured_ones(tmp_path):
    levels = levels_for(_config(tmp_path, ["trainer.drift.warn=0.01", "trainer.drift.stop=0.2"]))
    assert (levels.warn, levels.stop) == (0.01, 0.2) and "trainer.drift" in levels.regime
    assert levels_for(_config(tmp_path, ["trainer.drift.warn=0.5"])).stop == 0.5  # stop raised to warn


# ---------------------------------------------------------------------------------------------- the check
def test_a_healthy_run_is_checked_every_step_and_never_trips(tmp_path):
    run, rec = build(tmp_path)
    steps = [m for m in run.fit().metrics if "training/global_step" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["drift/tripped"] == 0.0 and m["drift/gap"] == 0.0 and m["drift/rows_checked"] == 4
        assert m["drift/warn_level"] == MEASURED_LEVELS[("hf", "fp32", False)][0]


def test_a_two_sided_gap_stops_the_run_before_the_update_naming_the_weights(tmp_path):
    run, rec = build(tmp_path, offsets=(0.2, -0.2))
    with pytest.raises(DriftError) as info:
        run.fit()
    text = str(info.value)
    assert text.startswith("step 1: the rollout's log-probs drifted") and "above trainer.drift.stop" in text
    assert "likely cause: weights:" in text
    assert "update_actor" not in rec.calls  # stopped before the update: nothing trained on the drifted batch
    assert info.value.metrics["drift/tripped"] == 2.0 and info.value.metrics["drift/cause/weights"] == 1.0
    stopped = run.history.metrics[-1]
    assert stopped["training/stopped"] == 1.0 and stopped["drift/cause/weights"] == 1.0


def test_a_one_sided_gap_names_sampling_parameters(tmp_path):
    run, _ = build(tmp_path, offsets=(-0.3, -0.1), extra=[f"{A}.rollout.top_k=5"])  # trainer below rollout
    with pytest.raises(DriftError, match=r"(?s)sampling: .*above the trainer's on 100% .*top_k=5"):
        run.fit()


def test_action_warn_flags_and_names_every_step_and_trains_on(tmp_path):
    run, rec = build(tmp_path, offsets=(0.2, -0.2), extra=["trainer.drift.action=warn"])
    steps = [m for m in run.fit().metrics if "training/global_step" in m]
    assert [m["drift/tripped"] for m in steps] == [2.0, 2.0]
    assert all(m["drift/cause/weights"] == 1.0 for m in steps) and rec.calls.count("update_actor") == 2
    assert run.drift.tripped_steps == [1, 2]


def test_a_gap_between_warn_and_stop_warns_only(tmp_path):
    run, rec = build(tmp_path, offsets=(0.02, -0.02), extra=["trainer.drift.warn=0.001", "trainer.drift.stop=0.5"])
    steps = [m for m in run.fit().metrics if "training/global_step" in m]
    assert [m["drift/tripped"] for m in steps] == [1.0, 1.0] and rec.calls.count("update_actor") == 2


def test_the_step_without_an_old_log_prob_pass_recomputes_a_few_rows_before_the_update(tmp_path):
    # one mini-batch: pi_old comes from the update's own pass; the detector recomputes the rows itself, first
    run, rec = build(tmp_path, offsets=(0.2, -0.2), mini=2)
    assert run.plan.old_log_prob_in_update
    with pytest.raises(DriftError):
        run.fit()
    # the check's recomputation, then the diagnosis's (at the run's and at other temperatures); no update
    assert rec.calls[:3] == ["generate", "compute_log_prob", "compute_log_prob"] and "update_actor" not in rec.calls
    assert len(rec.seen["compute_log_prob"]) == 4  # a few rows (here: all four)


def test_disabled_the_detector_does_nothing(tmp_path):
    run, rec = build(tmp_path, offsets=(0.2, -0.2), extra=["trainer.drift.enable=false"])
    assert run.drift is None and DriftMonitor.from_config(run.config) is None
    steps = [m for m in run.fit().metrics if "training/global_step" in m]
    assert len(steps) == 2 and not any(k.startswith("drift/") for m in steps for k in m)


def test_only_rows_of_the_weights_being_trained_are_judged(tmp_path):
    batch = DataProto.from_dict({"response_mask": torch.ones(4, R)})
    assert fresh_rows(batch).tolist() == [True] * 4  # no version columns: the synchronous modes
    batch.non_tensor_batch.update({"param_version_start": np.array([3, 2, 3, 3]),
                                   "param_version_end": np.array([3, 3, 4, 3]),
                                   "staleness": np.array([0, 1, 0, 0])})
    assert fresh_rows(batch).tolist() == [True, False, False, True]


def test_prompts_that_are_not_the_trainers_rendering_name_the_template(tmp_path):
    run, rec = build(tmp_path, raw_prompt_ids=lambda ids: [*ids[:-1], 999])  # the trainer renders another last id
    with pytest.raises(DriftError, match="template: the rollout's prompts are not the trainer's rendering") as info:
        run.fit()
    assert info.value.metrics["drift/template_mismatch_fraction"] == 1.0
    healthy, _ = build(tmp_path / "ok", raw_prompt_ids=lambda ids: ids)
    steps = [m for m in healthy.fit().metrics if "training/global_step" in m]
    assert all(m["drift/template_mismatch_fraction"] == 0.0 for m in steps)
    assert P == 3  # (the fake prompts are P ids each, all attended)


# ---------------------------------------------------------------------------------------------- weight versions
def test_every_token_carries_the_weight_version_that_generated_it():
    from hybridflow.trainer.asynchronous.staleness import tag_versions

    batch = DataProto.from_dict({"response_mask": torch.ones(3, 5, dtype=torch.long),
                                 "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1]] * 2 + [[1, 1, 1, 1, 1, 0, 0]])})
    batch.non_tensor_batch["weight_segments"] = np.array([None, [2, 3], None], dtype=object)
    tag_versions(batch, [4, 4, 5], [4, 5, 5])
    assert batch.batch["token_versions"].tolist() == [[4, 4, 4, 4, 4],   # one version
                                                      [4, 4, 5, 5, 5],   # a partial rollout across a sync
                                                      [5, 5, 5, -1, -1]]  # padding: -1


def test_the_synchronous_mode_tags_every_sample_with_the_version_that_generated_it(tmp_path):
    run, rec = build(tmp_path)
    steps = [m for m in run.fit().metrics if "training/global_step" in m]
    assert [m["weights/version"] for m in steps] == [0.0, 1.0]  # step 2 generated after the first update
    trained = rec.seen["update_actor"]
    assert trained.batch["token_versions"].unique().tolist() == [1]
    assert list(trained.non_tensor_batch["param_version_start"]) == [1] * 4


def test_staleness_beyond_the_bound_is_an_error_not_a_count():
    from hybridflow.trainer.asynchronous.staleness import StalenessError, staleness_metrics, tag_versions

    batch = DataProto.from_dict({"response_mask": torch.ones(2, 2, dtype=torch.long)})
    tag_versions(batch, [3, 1], [3, 1])
    assert staleness_metrics(batch, 3, bound=2)["training/staleness/max"] == 2.0
    with pytest.raises(StalenessError, match="staleness 2 is beyond this mode's bound of 1"):
        staleness_metrics(batch, 3, bound=1)
