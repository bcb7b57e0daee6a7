"""Validation of agent-loop rows: tool-use statistics of the held-out answers and samples with segments."""

from __future__ import annotations

from hybridflow.trainer.validation import Validator, trajectory_metrics


def test_trajectory_metrics_count_turns_and_tool_use():
    metrics = trajectory_metrics(turns=[2, 4, 4, 2], tool_calls=[0.0, 1.0, 2.0, 0.0])
    assert metrics == {"val-aux/num_turns/min": 2.0, "val-aux/num_turns/max": 4.0, "val-aux/num_turns/mean": 3.0,
                       "val-aux/agent/tool_calls_per_trajectory/mean": 0.75, "val-aux/agent/tool_call_rate": 0.5}
    assert trajectory_metrics([], []) == {}  # rows from no agent loop: nothing to report
    assert set(trajectory_metrics([2, 2], [])) == {"val-aux/num_turns/min", "val-aux/num_turns/max",
                                                   "val-aux/num_turns/mean"}


def test_samples_keep_segments_only_for_responses_with_observations():
    v = Validator(groups=None, dataloader=[], reward_fn=None, tokenizer=None, val_kwargs=None, num_log_samples=2,
                  seed=0)
    segments = [[("call", 1), ("result", 0), ("answer", 1)], [("direct", 1)]]
    samples = v._samples(["q0", "q1"], ["call result answer", "direct"], [1.0, 0.0], segments, step=7)
    by_prompt = {s["prompt"]: s for s in samples}
    assert by_prompt["q0"]["segments"] == [["call", 1], ["result", 0], ["answer", 1]]
    assert "segments" not in by_prompt["q1"] and by_prompt["q1"]["response"] == "direct"
    assert all(s["step"] == 7 for s in samples)
