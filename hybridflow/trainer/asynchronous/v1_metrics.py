"""Metrics of verl's V1 modes: per-sample policy versions and ages, and one row per step from several mini-batches.

``off_policy_metrics`` reads the version stamps every trained trajectory carries (``param_version_start`` /
``param_version_end``: the weight versions of its first and last token; a partial rollout continued after a
weight sync spans several) and the group's ``submit_step``:

* ``training/off_policy/trajectory_spans/*``: versions one trajectory was generated with (1: one version);
* ``training/off_policy/trajectory_staleness/*``: trained version minus the newest version it used;
* ``training/off_policy/trajectory_staleness_worst/*``: trained version minus the oldest;
* ``training/off_policy/sample_age/*``: steps since the group was submitted, plus one -- what
  ``trainer.v1.sampler.max_off_policy_threshold`` bounds.

``StepMetrics`` folds the metrics of a step's mini-batches (``separate_async`` trains ``parameter_sync_step`` of
them per step) into one row as verl's aggregator does: timings and counts summed, ``max``/``min`` kept, the step
counter's last value, everything else averaged weighted by the mini-batch's samples.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from hybridflow.protocol import DataProto

__all__ = ["off_policy_metrics", "tag_submit_steps", "StepMetrics"]


def tag_submit_steps(batch: DataProto, steps: list[int]) -> None:
    """The ``submit_step`` column: the step that submitted each row's group."""
    batch.non_tensor_batch["submit_step"] = np.asarray([int(s) for s in steps], dtype=np.int64)


def off_policy_metrics(batch: DataProto, trained_version: int, step: int) -> dict[str, float]:
    """verl's ``training/off_policy/*`` of a batch about to be trained at weight version ``trained_version``."""
    rows = batch.non_tensor_batch
    start = np.asarray(rows["param_version_start"], dtype=np.int64)
    end = np.asarray(rows["param_version_end"], dtype=np.int64)
    values = {
        "trajectory_spans": end - start + 1,
        "trajectory_staleness": int(trained_version) - end,
        "trajectory_staleness_worst": int(trained_version) - start,
    }
    if "submit_step" in rows:
        values["sample_age"] = int(step) - np.asarray(rows["submit_step"], dtype=np.int64) + 1
    out = {}
    for name, v in values.items():
        out.update({f"training/off_policy/{name}/mean": float(v.mean()), f"training/off_policy/{name}/max": float(v.max()),
                    f"training/off_policy/{name}/min": float(v.min())})
    return out


_SUMMED = ("/evicted_samples", "/discarded_surplus_samples")
_LAST = ("training/global_step", "training/epoch", "training/skipped_steps")


class StepMetrics:
    """Fold several mini-batches' metric dicts into one step row (see the module docstring)."""

    def __init__(self):
        self.values: dict[str, list[float]] = defaultdict(list)
        self.weights: dict[str, list[int]] = defaultdict(list)

    def add(self, metrics: dict[str, float], samples: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                continue
            self.values[key].append(float(value))
            self.weights[key].append(max(int(samples), 1))

    def _rule(self, key: str) -> str:
        lower = key.lower()
        if key in _LAST or lower.endswith("/lr") or key.startswith("fully_async/count/"):
            return "last"
        if lower.startswith(("timing_s/", "timing_per_token_ms/")) or key.endswith(_SUMMED):
            return "sum"
        if "max" in lower:
            return "max"
        if "min" in lower:
            return "min"
        if "count" in lower or "total" in lower:
            return "sum"
        return "mean"

    def result(self) -> dict[str, float]:
        out = {}
        for key, values in self.values.items():
            rule = self._rule(key)
            if rule == "last":
                out[key] = values[-1]
            elif rule == "sum":
                out[key] = float(sum(values))
            elif rule == "max":
                out[key] = max(values)
            elif rule == "min":
                out[key] = min(values)
            else:
                w = self.weights[key]
                out[key] = float(sum(v * c for v, c in zip(values, w)) / sum(w))
        return out
