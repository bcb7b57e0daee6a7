"""The drift detector: every step, the rollout's log-probs of its own tokens against the trainer's recomputation.

A run can exit 0 with healthy curves and still be wrong: the rollout generated with stale weights, its log-probs
were taken after temperature / top-p / top-k, the adapter of a LoRA run was not applied, or the rollout rendered
its prompts with another chat template than the trainer's.  Each of these shows as a gap between the probability
the rollout gave each token it sampled and the probability the trainer computes for the same token
(``training/rollout_probs_diff_mean``: mean |p_rollout - p_trainer| over the produced tokens), or as prompt ids that
differ from the trainer's rendering.

Per step (``trainer.drift.enable``, on by default) :class:`DriftMonitor` reads the gap over the rows generated
by the weights being trained (rows of older weights -- one-step-off, async modes -- differ by design and are left
out), compares it with two levels that depend on the engine and dtype (:mod:`hybridflow.trainer.drift_levels`:
measured on healthy runs, docs/drift.md) and logs ``drift/*``.  Above ``warn`` the step is flagged and the cheap
discriminators of :mod:`hybridflow.trainer.drift_causes` name the likely cause; above ``stop`` (with
``trainer.drift.action=stop``) the run ends with :class:`DriftError` (exit 1) carrying that diagnosis.

Metrics: ``drift/gap`` (the gap judged), ``drift/rows_checked``, ``drift/warn_level``, ``drift/stop_level``,
``drift/tripped`` (0 healthy, 1 above warn, 2 above stop), ``drift/cause/<name>`` (1 for each cause named) and
``drift/template_mismatch_fraction``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from hybridflow.algorithms.rollout_correction import rollout_probs_diff
from hybridflow.protocol import DataProto
from hybridflow.trainer.drift_causes import (
    CAUSES,
    Diagnosis,
    check_rows,
    diagnose,
    fresh_rows,
    rows_gap,
    template_mismatch,
    trainer_log_probs,
)
from hybridflow.trainer.drift_levels import DriftLevels, levels_for
from hybridflow.trainer.step_failures import StepFailedError
from hybridflow.trainer.step_log import StepLog

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["DriftError", "DriftMonitor", "fresh_rows"]

_LOG = logging.getLogger(__name__)


class DriftError(StepFailedError):
    """The rollout's log-probs drifted from the trainer's past ``trainer.drift.stop``: the message names the likely
    cause and its evidence."""

    hint = ("the drift of every step is in the metrics log (drift/*) and the run report's drift panel; fix the cause "
            "named above, or set trainer.drift.action=warn to only flag such steps (docs/drift.md)")


class DriftMonitor:
    """See the module docstring; one per run (``run.drift``), ``None`` when ``trainer.drift.enable=false``."""

    def __init__(self, levels: DriftLevels, action: str = "stop"):
        self.levels = levels
        self.action = action
        self.tripped_steps: list[int] = []

    @classmethod
    def from_config(cls, config) -> "DriftMonitor | None":
        drift = config.trainer.drift
        return cls(levels_for(config), drift.action) if drift.enable else None

    # ------------------------------------------------------------------ the step's check
    def check(self, run: Run, batch: DataProto, log: StepLog) -> None:
        """Judge the step's batch before its update (``batch`` with the rollout's log-probs and pi_old if a pass
        computed it); a stop raises before the update is applied."""
        metrics = log.metrics
        gap, rows = self.measure(run, batch)
        mismatch = template_mismatch(run, batch)
        metrics.update({"drift/warn_level": self.levels.warn, "drift/stop_level": self.levels.stop,
                        "drift/rows_checked": float(rows), "drift/template_mismatch_fraction": mismatch})
        if gap is not None:
            metrics["drift/gap"] = gap
        over_warn = (gap is not None and gap > self.levels.warn) or mismatch > 0
        over_stop = (gap is not None and gap > self.levels.stop) or mismatch > 0
        metrics["drift/tripped"] = 2.0 if over_stop else 1.0 if over_warn else 0.0
        if not over_warn:
            return
        diagnosis = diagnose(run, batch, gap, self.levels, mismatch)
        metrics.update({f"drift/cause/{name}": 1.0 for name in diagnosis.causes})
        self.tripped_steps.append(run.global_steps + 1)
        text = self.describe(run, gap, diagnosis, over_stop)
        if over_stop and self.action == "stop":
            raise DriftError(text, metrics=dict(metrics))
        _LOG.warning("%s", text)

    def measure(self, run: Run, batch: DataProto) -> tuple[float | None, int]:
        """The gap over the fresh rows and how many rows it covers; ``(None, 0)`` when the step has no pair of
        log-probs to compare (no rollout log-probs, or only rows of older weights).  When the step ran no
        old_log_prob pass (pi_old from the update's own pass, or the rollout's log-probs reused), the trainer
        recomputes a few fresh rows (``drift_causes.check_rows``) -- before the update, with the weights that
        generated them."""
        tensors = batch.batch
        if "rollout_log_probs" not in tensors:
            return None, 0
        fresh = fresh_rows(batch)
        # a versioned push (fully async, V1) counts versions, not updates: with updates not pushed yet, even rows of
        # the current version were generated by older weights than the trainer's
        if not fresh.any() or getattr(run.weights, "updated", False):
            return None, 0
        old = tensors.get("old_log_probs")
        if old is not None and not run.plan.reuse_rollout_log_probs:  # the old_log_prob pass ran: all fresh rows
            keep = torch.as_tensor(fresh)
            mask = tensors["response_mask"][keep]
            if not bool(mask.any()):
                return None, 0
            diff = rollout_probs_diff(tensors["rollout_log_probs"][keep], old[keep], mask)
            return diff.get("training/rollout_probs_diff_mean"), int(keep.sum())
        rows = check_rows(run, batch)
        if rows is None:
            return None, 0
        return rows_gap(rows, trainer_log_probs(run, rows, run.config.actor_rollout_ref.rollout.temperature)), len(rows)

    def describe(self, run: Run, gap: float | None, diagnosis: Diagnosis, over_stop: bool) -> str:
        level = "stop" if over_stop else "warn"
        value = self.levels.stop if over_stop else self.levels.warn
        step = run.global_steps + 1
        if gap is not None and gap > self.levels.warn:
            head = (f"step {step}: the rollout's log-probs drifted from the trainer's (mean |p_rollout - p_trainer| "
                    f"= {gap:.3g} over the step's tokens, above trainer.drift.{level}={value:.3g} for "
                    f"{self.levels.regime})")
        else:  # the prompt ids alone: the trainer scores the rollout's ids, so no log-prob gap shows it
            head = f"step {step}: the rollout's prompts are not the trainer's rendering of the same rows"
        lines = [head, "likely cause: " + (diagnosis.summary() if diagnosis.causes else
                                           "none of the checked causes (" + ", ".join(CAUSES) + ") matched")]
        lines += [f"  - {line}" for line in diagnosis.evidence]
        return "\n".join(lines)
