"""Per-step failure accounting: a run never trains on in silence when its trajectories, rewards or tools fail.

Three things can fail one by one without stopping a step:

* a **trajectory**: its agent loop raised (the row's ``agent_error`` column holds the traceback; the row is
  kept untrained, ``response_mask`` 0);
* a **reward**: the scorer raised, timed out, returned something that is not a finite number, or could not score
  the row at all -- an unknown ``data_source`` or no ground truth for the built-in scorers (the row's
  ``reward_error`` column says why; the row scored ``reward_model.error_score``);
* a **tool call**: the tool raised or ran out of time (the model read an error text instead of a result;
  counted in ``agent/tool_errors/tool_exception`` and ``agent/tool_errors/timeout``).

Each is counted in the step's metrics as a fraction -- ``rollout/failed_fraction``,
``reward/error_fraction``, ``rollout/tool_crash_fraction`` -- and the run goes on while the fraction stays at
or below ``trainer.tolerated_failure_fraction``.  Above it, and always when *every* one failed, the run stops
with :class:`StepFailedError` naming what failed, how many, and the first error.  A step with no model
token left to train on (the sum of ``response_mask`` is 0) stops the run the same way: its update would do
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto

__all__ = ["StepFailedError", "FailureCount", "trajectory_failures", "reward_failures", "tool_failures",
           "check_failures", "check_trained_tokens", "TOOL_CRASH_KINDS"]

# Tool error kinds that are the tool's fault, not the model's (malformed calls are the model's to learn from).
TOOL_CRASH_KINDS = ("tool_exception", "timeout", "bad_return")
KEY = "trainer.tolerated_failure_fraction"


class StepFailedError(RuntimeError):
    """Too much of a step failed to train on it; ``metrics`` are the step's failure counts (for the log)."""

    def __init__(self, message: str, metrics: dict[str, float] | None = None):
        super().__init__(message)
        self.metrics = dict(metrics or {})


@dataclass(frozen=True)
class FailureCount:
    """``failed`` of ``total`` items of one kind failed this step; ``first`` is the first one's error."""

    kind: str  # "trajectories", "rewards", "tool calls": the words of the message
    metric: str  # the fraction's metric name
    failed: int
    total: int
    first: str | None = None
    fix: str = ""

    @property
    def fraction(self) -> float:
        return self.failed / self.total if self.total else 0.0


def _errors(batch: DataProto, column: str) -> list[str] | None:
    """The non-empty entries of an error column, or ``None`` when the batch has no such column."""
    values = batch.non_tensor_batch.get(column)
    if values is None:
        return None
    return [v if isinstance(v, str) else "(no message)" for v in values if v is not None and v is not False]


def trajectory_failures(batch: DataProto) -> FailureCount:
    """Trajectories whose agent loop raised (``agent_error``), of all the batch's trajectories."""
    errors = _errors(batch, "agent_error") or []
    return FailureCount("trajectories", "rollout/failed_fraction", len(errors), len(batch),
                        errors[0] if errors else None,
                        "fix the agent loop (the traceback above), or run it alone with trainer.backend=local "
                        "under pdb")


def reward_failures(batch: DataProto) -> FailureCount | None:
    """Samples the rule reward could not score (``reward_error``); ``None`` when no rule scorer ran."""
    errors = _errors(batch, "reward_error")
    if errors is None:
        return None
    return FailureCount("rewards", "reward/error_fraction", len(errors), len(batch), errors[0] if errors else None,
                        "fix the reward function (custom_reward_function.path/name) or the data "
                        "(data_source, reward_model.ground_truth); a slow one needs a larger reward_model.timeout_s")


def tool_failures(metrics: dict[str, float], num_trajectories: int) -> FailureCount | None:
    """Tool calls that crashed (the tool raised, timed out or returned garbage), of all tool calls this step;
    from the rollout's ``agent/*`` metrics.  ``None`` when no tool was called."""
    calls = metrics.get("agent/tool_calls_per_trajectory/mean", 0.0) * num_trajectories
    if calls < 0.5:
        return None
    kinds = {k: int(round(metrics.get(f"agent/tool_errors/{k}", 0.0))) for k in TOOL_CRASH_KINDS}
    crashed = sum(kinds.values())
    detail = ", ".join(f"{k}: {v}" for k, v in kinds.items() if v)
    return FailureCount("tool calls", "rollout/tool_crash_fraction", crashed, int(round(calls)),
                        f"crashed calls by kind: {detail}" if crashed else None,
                        "the model read the tools' error texts instead of results; test the tool on its own, or "
                        "raise its timeout in the tool config")


def check_failures(counts: list[FailureCount | None], tolerated: float, metrics: dict[str, float]) -> None:
    """Add each count's fraction to ``metrics`` (the largest over a step's generation rounds); raise
    :class:`StepFailedError` when one is above ``tolerated`` or when every item of a kind failed."""
    present = [c for c in counts if c is not None]
    for c in present:
        metrics[c.metric] = max(metrics.get(c.metric, 0.0), c.fraction)
    for c in present:
        if c.failed and (c.failed == c.total or c.fraction > tolerated):
            raise StepFailedError(_message(c, tolerated), dict(metrics))


def _message(c: FailureCount, tolerated: float) -> str:
    how = (f"all {c.total} {c.kind} of the step failed" if c.failed == c.total else
           f"{c.failed} of {c.total} {c.kind} of the step failed ({c.fraction:.0%}), more than "
           f"{KEY}={tolerated:g} allows")
    first = f"\nFirst error:\n{c.first.rstrip()}" if c.first else ""
    return f"the run stopped: {how} ({c.metric}={c.fraction:.3g}).{first}\nFix: {c.fix}."


def check_trained_tokens(batch: DataProto, metrics: dict[str, Any]) -> None:
    """A step whose ``response_mask`` is 0 everywhere has nothing to train on: stop instead of a no-op update."""
    mask = batch.batch.get("response_mask") if batch.batch is not None else None
    if mask is None or int(mask.sum()) > 0:
        return
    lengths = batch.batch["responses"].shape[-1] if "responses" in batch.batch else 0
    mismatched = int(metrics.get("agent/tokenization_mismatch_count", 0) or 0)
    cause = (f" The model did generate: {mismatched} of the {len(batch)} trajectories failed the strict tokenization "
             "check (agent/tokenization_mismatch_count: the ids generated turn by turn are not one render of the "
             "conversation; their decoded texts may still agree) and were masked out "
             f"(agent/untrained_model_tokens={metrics.get('agent/untrained_model_tokens', 0):g}). Fix: set "
             "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable (train when the "
             "texts agree up to whitespace, as verl's strict mode does after a warning) or a chat template whose "
             "turns tokenize the same alone and together." if mismatched else "")
    raise StepFailedError(
        f"the run stopped: no model token of the step's {len(batch)} trajectories is trained on (the sum of "
        f"response_mask is 0; responses are {lengths} tokens wide)." + (cause or " Every token came from somewhere "
        "other than the model (failed trajectories, tool or user observations) or every response is empty. Fix: "
        "check that the agent loop marks the model's tokens with response_mask 1, and data.max_response_length."),
        {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.number))},
    )
