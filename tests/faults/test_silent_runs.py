"""No silent runs: a step where every trajectory failed, every reward errored or no model token is trained on
stops ``hybridflow train`` with a non-zero exit and the first error; partial failures below
``trainer.tolerated_failure_fraction`` are counted (``rollout/failed_fraction``, ``reward/error_fraction``), shown in
the report, and the run goes on.  Each case is one that used to exit 0 having learned nothing (issue 21)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from .conftest import A, base_args, invoke_cli, metrics_file, read_metrics

HERE = Path(__file__).parent
REWARDS = HERE / "faulty_rewards.py"
LOOPS = HERE / "faulty_loops.yaml"
SAMPLES = 4 * 2  # base_args: 4 prompts x rollout.n=2


@pytest.fixture
def train(tmp_path, nano_model_dir):
    """``train(data_file, extra, steps)``: ``hybridflow train`` on the nano model from ``tmp_path``."""
    def run(data, extra, steps=1):
        return invoke_cli(base_args(nano_model_dir, data, tmp_path, steps=steps, extra=extra), tmp_path)

    return run


def _steps(tmp_path):
    return [m for m in read_metrics(tmp_path) if "training/global_step" in m]


def _report(tmp_path) -> str:
    return (metrics_file(tmp_path).parent / "report.html").read_text()


def _stopped_at_step_1(result, tmp_path, needles):
    assert result.escaped is None, result.message
    assert result.rc == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr[-3000:])
    (step,) = _steps(tmp_path)  # the failed step's counts are logged, and nothing after it
    assert step["training/stopped"] == 1.0
    assert "The run stopped with an error" in _report(tmp_path)
    return step


def _loop(name):
    return [f"{A}.rollout.agent.agent_loop_config_path={LOOPS}", f"{A}.rollout.agent.default_agent_loop={name}"]


def _reward(name):
    return [f"custom_reward_function.path={REWARDS}", f"custom_reward_function.name={name}"]


# ------------------------------------------------------------------------------------------------ trajectories
def test_an_agent_loop_raising_on_every_trajectory_stops_the_run(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet", _loop("raises_always"), steps=3)
    step = _stopped_at_step_1(result, tmp_path, [f"all {SAMPLES} trajectories of the step failed",
                                                 "agent loop bug: lost the conversation state",
                                                 "rollout/failed_fraction=1"])
    assert step["rollout/failed_fraction"] == 1.0 and step["agent/error_count"] == SAMPLES


def test_a_step_where_everything_failed_stops_even_when_all_failures_are_tolerated(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet", [*_loop("raises_always"), "trainer.tolerated_failure_fraction=1"])
    _stopped_at_step_1(result, tmp_path, [f"all {SAMPLES} trajectories of the step failed"])


def test_an_unregistered_agent_name_in_the_data_is_an_error_before_training(tmp_path, fault_data, train):
    df = pd.read_parquet(fault_data / "train.parquet")
    df["agent_name"] = ["single_turn_agent"] * 3 + ["no_such_loop"] + ["single_turn_agent"] * (len(df) - 4)
    df.to_parquet(tmp_path / "named.parquet")
    result = train(tmp_path / "named.parquet", [])
    assert result.escaped is None and result.rc == 2, result.message
    assert f"row 3 of '{tmp_path / 'named.parquet'}'" in result.stderr
    # the registered loops are listed (other tests of this process may have registered more)
    assert "'no_such_loop'" in result.stderr and "single_turn_agent" in result.stderr and "tool_agent" in result.stderr
    assert not read_metrics(tmp_path)  # nothing trained


def test_a_step_without_a_model_token_to_train_on_stops_the_run(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet", _loop("masks_everything"), steps=3)
    _stopped_at_step_1(result, tmp_path, ["no model token", "sum of response_mask is 0"])


def test_partial_agent_loop_failures_are_counted_reported_and_the_run_goes_on(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet",
                   [*_loop("raises_on_some_prompts"), "data.shuffle=false"], steps=2)
    assert result.escaped is None and result.rc == 0, result.message
    steps = _steps(tmp_path)
    assert [s["rollout/failed_fraction"] for s in steps] == [0.25, 0.25]  # prompt 0 (then 4) of 4, x n=2
    assert [s["agent/error_count"] for s in steps] == [2.0, 2.0]
    report = _report(tmp_path)
    assert "trajectories failed (agent loop raised)</b>: in 2 step(s)" in report and "4 in all" in report


def test_partial_failures_above_the_tolerated_fraction_stop_the_run(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet",
                   [*_loop("raises_on_some_prompts"), "data.shuffle=false", "trainer.tolerated_failure_fraction=0.2"],
                   steps=2)
    _stopped_at_step_1(result, tmp_path, ["2 of 8 trajectories of the step failed (25%)",
                                          "trainer.tolerated_failure_fraction=0.2", "agent loop bug on prompt 0"])


# ------------------------------------------------------------------------------------------------ rewards
# (reward_model.use_reward_loop=true, the default, scores in the agent loops; false scores in the trainer)
@pytest.mark.parametrize("name,needle", [
    ("raises", "RuntimeError: scorer bug: could not parse the answer"),
    ("returns_nan", "non-finite score nan"),
    ("returns_text", "returned str 'correct'"),
])
@pytest.mark.parametrize("reward_loop", [True, False], ids=["reward_loop", "trainer_scores"])
def test_a_reward_function_failing_on_every_sample_stops_the_run(name, needle, reward_loop, tmp_path, fault_data,
                                                               train):
    result = train(fault_data / "train.parquet",
                   [*_reward(name), f"reward_model.use_reward_loop={str(reward_loop).lower()}"], steps=3)
    step = _stopped_at_step_1(result, tmp_path, [f"all {SAMPLES} rewards of the step failed", needle])
    assert step["reward/error_fraction"] == 1.0 and step["reward/error_count"] == SAMPLES


def test_a_reward_function_timing_out_on_every_sample_stops_the_run(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet",
                   [*_reward("hangs"), "reward_model.num_workers=2", "reward_model.timeout_s=0.5"], steps=3)
    step = _stopped_at_step_1(result, tmp_path, [f"all {SAMPLES} rewards of the step failed",
                                                 "timed out: scoring exceeded timeout_s=0.5"])
    assert step["reward/timeout_count"] == SAMPLES


def test_a_reward_function_with_the_wrong_signature_is_refused_at_start(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet", _reward("wrong_signature"))
    assert result.escaped is None and result.rc == 2, result.message
    for needle in ("custom_reward_function.name='wrong_signature'", str(REWARDS), "wrong_signature(solution, answer)",
                   "(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"):
        assert needle in result.stderr, (needle, result.stderr)
    assert not read_metrics(tmp_path)


def test_an_unknown_data_source_with_the_built_in_scorers_stops_the_run(tmp_path, fault_data, train):
    df = pd.read_parquet(fault_data / "train.parquet")
    df["data_source"] = "my_lab/puzzles"
    df.to_parquet(tmp_path / "unknown.parquet")
    result = train(tmp_path / "unknown.parquet", [], steps=3)
    _stopped_at_step_1(result, tmp_path, [f"all {SAMPLES} rewards of the step failed",
                                          "No built-in reward scorer for data_source 'my_lab/puzzles'"])


def test_a_missing_ground_truth_is_a_reward_error_not_a_zero(tmp_path, fault_data, train):
    df = pd.read_parquet(fault_data / "train.parquet")
    df["reward_model"] = [{"style": "rule", "ground_truth": None} for _ in range(len(df))]
    df.to_parquet(tmp_path / "no_truth.parquet")
    result = train(tmp_path / "no_truth.parquet", [], steps=3)
    _stopped_at_step_1(result, tmp_path, [f"all {SAMPLES} rewards of the step failed",
                                          "reward_model.ground_truth is None"])


@pytest.mark.parametrize("reward_loop", [True, False], ids=["reward_loop", "trainer_scores"])
def test_partial_reward_errors_are_counted_reported_and_the_run_goes_on(reward_loop, tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet",
                   [*_reward("raises_on_some_prompts"), "data.shuffle=false",
                     f"reward_model.use_reward_loop={str(reward_loop).lower()}"], steps=2)
    assert result.escaped is None and result.rc == 0, result.message
    steps = _steps(tmp_path)
    assert [s["reward/error_fraction"] for s in steps] == [0.25, 0.25]
    assert [s["reward/error_count"] for s in steps] == [2.0, 2.0]
    assert "rewards could not be scored (error or timeout)</b>: in 2 step(s)" in _report(tmp_path)


def test_a_clean_run_reports_zero_fractions_and_no_failure_box(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet", [])
    assert result.escaped is None and result.rc == 0, result.message
    (step,) = _steps(tmp_path)
    assert step["rollout/failed_fraction"] == 0.0 and step["reward/error_fraction"] == 0.0
    assert "class='failures'" not in _report(tmp_path)


def test_the_tolerated_fraction_is_validated(tmp_path, fault_data, train):
    result = train(fault_data / "train.parquet", ["trainer.tolerated_failure_fraction=1.5"])
    assert result.rc == 2 and "trainer.tolerated_failure_fraction=1.5 is out of range: it must be between 0" in result.stderr
