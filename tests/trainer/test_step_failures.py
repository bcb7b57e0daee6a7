"""The counting rules of ``trainer/step_failures.py`` on hand-made batches (golden fractions and messages);
the runs that exercise them end to end are in ``tests/faults/test_silent_runs.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.step_failures import (
    StepFailedError,
    check_failures,
    check_trained_tokens,
    reward_failures,
    tool_failures,
    trajectory_failures,
)


def _batch(n=8, agent_errors=None, reward_errors=None, mask=None):
    non_tensors = {}
    for key, values in (("agent_error", agent_errors), ("reward_error", reward_errors)):
        if values is not None:
            column = np.empty(n, dtype=object)
            column[:] = values
            non_tensors[key] = column
    mask = torch.ones(n, 4, dtype=torch.long) if mask is None else mask
    return DataProto.from_dict({"response_mask": mask, "responses": torch.zeros(n, 4, dtype=torch.long)}, non_tensors)


def test_counts_and_first_errors():
    batch = _batch(agent_errors=[None, "boom A", None, "boom B"] + [None] * 4,
                   reward_errors=["gsm8k: bad"] + [None] * 7)
    t, r = trajectory_failures(batch), reward_failures(batch)
    assert (t.failed, t.total, t.fraction, t.first) == (2, 8, 0.25, "boom A")
    assert (r.failed, r.total, r.fraction, r.first) == (1, 8, 0.125, "gsm8k: bad")
    assert reward_failures(_batch()) is None  # no rule scorer ran (a reward model scored)
    assert trajectory_failures(_batch()).failed == 0  # no agent_error column: nothing failed


def test_tool_crashes_count_only_the_tools_fault():
    metrics = {"agent/tool_calls_per_trajectory/mean": 1.5, "agent/tool_errors/tool_exception": 3.0,
               "agent/tool_errors/timeout": 1.0, "agent/tool_errors/invalid_json": 5.0}  # JSON: the model's fault
    c = tool_failures(metrics, num_trajectories=8)
    assert (c.failed, c.total) == (4, 12) and "tool_exception: 3, timeout: 1" in c.first
    assert tool_failures({}, 8) is None  # no tool called


@pytest.mark.parametrize("failed,tolerated,stops", [(0, 0.0, False), (1, 0.0, True), (2, 0.25, False),
                                                    (3, 0.25, True), (7, 1.0, False), (8, 1.0, True)])
def test_the_tolerated_fraction_and_the_all_failed_rule(failed, tolerated, stops):
    batch = _batch(agent_errors=["trace"] * failed + [None] * (8 - failed))
    metrics = {}
    if stops:
        with pytest.raises(StepFailedError) as e:
            check_failures([trajectory_failures(batch)], tolerated, metrics)
        assert e.value.metrics["rollout/failed_fraction"] == failed / 8
        assert "First error:\ntrace" in str(e.value)
        assert ("all 8 trajectories" if failed == 8 else f"{failed} of 8 trajectories") in str(e.value)
    else:
        check_failures([trajectory_failures(batch)], tolerated, metrics)
    assert metrics["rollout/failed_fraction"] == failed / 8


def test_the_fraction_reported_is_the_worst_round_of_the_step():
    metrics = {}
    check_failures([trajectory_failures(_batch(agent_errors=["x"] * 2 + [None] * 6))], 0.5, metrics)
    check_failures([trajectory_failures(_batch(agent_errors=["x"] + [None] * 7))], 0.5, metrics)
    assert metrics["rollout/failed_fraction"] == 0.25


def test_a_step_without_model_tokens_stops():
    check_trained_tokens(_batch(mask=torch.tensor([[0, 0, 0, 0]] * 7 + [[0, 1, 0, 0]])), {})
    with pytest.raises(StepFailedError, match="sum of response_mask is 0") as info:
        check_trained_tokens(_batch(mask=torch.zeros(8, 4, dtype=torch.long)), {})
    assert "tokenization" not in str(info.value)
    # every trajectory masked by the strict tokenization check: the message names that cause and the key
    masked = {"agent/tokenization_mismatch_count": 8.0, "agent/untrained_model_tokens": 29.0}
    with pytest.raises(StepFailedError, match="8 of the 8 trajectories failed the strict tokenization check") as info:
        check_trained_tokens(_batch(mask=torch.zeros(8, 4, dtype=torch.long)), masked)
    assert "multi_turn.tokenization_sanity_check_mode=ignore_strippable" in str(info.value)
    assert "agent/untrained_model_tokens=29" in str(info.value)


def test_generation_rounds_with_and_without_failures_concatenate():
    """DAPO keeps generating rounds and concatenates them: the failure column must exist in every round."""
    from hybridflow.agents.base import AgentLoopOutput
    from hybridflow.agents.loop_worker import stack_outputs
    from hybridflow.launch.config import load_config

    rollout = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                           "critic.ppo_micro_batch_size_per_gpu=4"]).actor_rollout_ref.rollout
    ok = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3], response_mask=[1], num_turns=2)
    failed = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[0], response_mask=[0], num_turns=0,
                             extra_fields={"agent_error": "Traceback ..."})
    clean, broken = stack_outputs(None, rollout, [ok, ok]), stack_outputs(None, rollout, [ok, failed])
    both = DataProto.concat([clean, broken])
    assert both.non_tensor_batch["agent_error"].tolist() == [None, None, None, "Traceback ..."]
    assert trajectory_failures(both).failed == 1
