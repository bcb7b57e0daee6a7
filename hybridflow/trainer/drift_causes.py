"""Naming the cause of a drift between the rollout's and the trainer's log-probs: one cheap discriminator each.

Run only on a step the detector flagged (:mod:`hybridflow.trainer.drift`), on a few rows of it (``_SUBSET`` per
data-parallel rank), with the weights the trainer holds now:

* **sampling** -- sampling parameters applied to the rollout's log-probs.  A temperature: the trainer recomputes
  the rows at other temperatures; if one of them brings the gap down tenfold, the rollout's log-probs were taken at
  that temperature.  Top-k / top-p: log-probs renormalised over the kept tokens are never below the full
  distribution's, so a gap that is one-sided (rollout >= trainer on nearly every differing token) names them;
* **lora** -- a LoRA run whose rollout does not apply the adapter: the rows' base-model log-probs (the reference:
  the actor with its adapter disabled) match the rollout's far better than the actor's do;
* **weights** -- the rollout generated with other weights: an engine's weight digest differs from the trainer's
  (the fleet's last weight check, ``weight_facts``), or the rollout matches the reference (initial) weights better
  than the trainer's (never synced), or -- no other signature found -- a two-sided gap, which is what a stale
  weight version leaves;
* **template** -- the rollout's prompt ids are not the trainer's rendering of the row (``raw_prompt_ids``, the
  dataset's chat template and tokenizer): checked every step by :func:`template_mismatch`, it costs a comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hybridflow.protocol import DataProto

if TYPE_CHECKING:
    from hybridflow.trainer.drift_levels import DriftLevels
    from hybridflow.trainer.run_view import Run

__all__ = ["CAUSES", "Diagnosis", "check_rows", "diagnose", "fresh_rows", "rows_gap", "template_mismatch",
           "trainer_log_probs"]

CAUSES: dict[str, str] = {
    "weights": "the rollout generated with other weights than the trainer's (a weight sync skipped or failed, or "
               "weights stale after the engine's sleep/wake)",
    "sampling": "sampling parameters applied to the rollout's log-probs (temperature, top-p / top-k) while the "
                "trainer recomputes the plain temperature-scaled distribution",
    "lora": "the LoRA adapter is not applied (merged) in the rollout engine",
    "template": "the rollout's prompts are not the trainer's rendering (the chat template or tokenizer differs "
                "between rollout and trainer)",
}
_SUBSET = 8  # rows per data-parallel rank that the recomputations use
_TENFOLD = 0.1  # a discriminator explains the gap when it brings it below this share
_ONE_SIDED = 0.95  # share of differing tokens on the rollout's side that names a top-k / top-p renormalisation
_LOG_TOL = 1e-4  # log-prob differences below this are rounding, not a signature


@dataclass
class Diagnosis:
    """The causes named (in the order found) and one line of evidence each."""

    causes: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)

    def add(self, cause: str, evidence: str) -> None:
        if cause not in self.causes:
            self.causes.append(cause)
        self.evidence.append(f"[{cause}] {evidence}")

    def summary(self) -> str:
        return "; ".join(f"{name}: {CAUSES[name]}" for name in self.causes)


def fresh_rows(batch: DataProto) -> np.ndarray:
    """Rows generated entirely by the weights being trained (staleness 0, one weight version): True per row.
    Rows without version columns (the synchronous modes) are all fresh."""
    rows = batch.non_tensor_batch
    fresh = np.ones(len(batch), dtype=bool)
    if "staleness" in rows:
        fresh &= np.asarray(rows["staleness"], dtype=np.int64) == 0
    if "param_version_start" in rows and "param_version_end" in rows:
        fresh &= (np.asarray(rows["param_version_start"], dtype=np.int64)
                  == np.asarray(rows["param_version_end"], dtype=np.int64))
    return fresh


# ---------------------------------------------------------------------------------------------- template
def _rollout_prompt(batch: DataProto, i: int) -> list[int]:
    """Row ``i``'s prompt ids as the rollout generated from them (left padding dropped)."""
    width = batch.batch["input_ids"].shape[1] - batch.batch["responses"].shape[1]
    prompts = batch.batch["prompts"][i] if "prompts" in batch.batch else batch.batch["input_ids"][i, :width]
    mask = batch.batch["attention_mask"][i, : prompts.shape[0]].bool()
    return prompts[mask].tolist()


def template_mismatch(run: Run, batch: DataProto) -> float:
    """Share of rows whose rollout prompt ids differ from the trainer's rendering (``raw_prompt_ids``); 0 when the
    rows carry no rendering to compare with or the agent renders its own prompts (tool schemas shown)."""
    rows = batch.non_tensor_batch
    data = run.config.data
    if ("raw_prompt_ids" not in rows or "responses" not in batch.batch or data.tool_config_path
            or getattr(data, "function_tool_path", None)):
        return 0.0
    default = run.config.actor_rollout_ref.rollout.agent.default_agent_loop
    agents = rows.get("agent_name")
    checked = differ = 0
    for i, expected in enumerate(rows["raw_prompt_ids"]):
        agent = agents[i] if agents is not None and agents[i] else default
        if expected is None or agent != "single_turn_agent" or rows.get("agent_error", [None] * len(batch))[i]:
            continue
        checked += 1
        differ += int(_rollout_prompt(batch, i) != [int(t) for t in expected])
    return differ / checked if checked else 0.0


# ---------------------------------------------------------------------------------------------- recomputation
def check_rows(run: Run, batch: DataProto) -> DataProto | None:
    """A few fresh rows with tokens, a multiple of the data-parallel size (the dispatch splits them evenly)."""
    mask = batch.batch["response_mask"]
    keep = np.flatnonzero(fresh_rows(batch) & mask.bool().any(-1).numpy())
    dp = max(1, int(run.dp_size))
    size = min(len(keep), _SUBSET * dp) // dp * dp
    if size == 0:
        return None
    keys = [k for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "prompts",
                        "rollout_log_probs") if k in batch.batch]
    sub = batch.select(batch_keys=keys, non_tensor_batch_keys=[k for k in ("multi_modal_inputs",)
                                                               if k in batch.non_tensor_batch])
    return sub[torch.as_tensor(keep[:size])]


def trainer_log_probs(run: Run, sub: DataProto, temperature: float, reference: bool = False) -> torch.Tensor:
    """The trainer's log-probs of ``sub``'s tokens at ``temperature`` (the reference's with ``reference``)."""
    data = DataProto(batch=sub.batch, non_tensor_batch=dict(sub.non_tensor_batch),
                     meta_info={"temperature": float(temperature)})
    if reference:
        return run.groups.ref.compute_ref_log_prob(data).batch["ref_log_prob"]
    return run.groups.actor_rollout.compute_log_prob(data).batch["old_log_probs"]


def rows_gap(sub: DataProto, log_probs: torch.Tensor) -> float:
    mask = sub.batch["response_mask"].bool()
    r = sub.batch["rollout_log_probs"].double()[mask].exp()
    a = log_probs.double()[mask].exp()
    return float((r - a).abs().mean()) if r.numel() else 0.0


def _candidate_temperatures(t: float) -> list[float]:
    cands = [1.0, t * t, t ** 0.5, t / 2, 2 * t, 0.5, 0.7, 1.5]
    out: list[float] = []
    for c in cands:
        if c > 0 and abs(c - t) > 1e-3 and all(abs(c - o) > 1e-3 for o in out):
            out.append(round(c, 4))
    return out


# ---------------------------------------------------------------------------------------------- the discriminators
def _check_temperature(run: Run, sub: DataProto, gap_now: float, diag: Diagnosis) -> bool:
    t = float(run.config.actor_rollout_ref.rollout.temperature)
    best, best_t = gap_now, None
    for cand in _candidate_temperatures(t):
        g = rows_gap(sub, trainer_log_probs(run, sub, cand))
        if g < best:
            best, best_t = g, cand
    if best_t is not None and best < _TENFOLD * gap_now:
        diag.add("sampling", f"recomputed at temperature {best_t:g} the gap falls to {best:.3g} from {gap_now:.3g} at "
                             f"the trainer's temperature {t:g}: the rollout's log-probs were taken at another "
                             "temperature than actor_rollout_ref.rollout.temperature")
        return True
    return False


def _check_renormalised(run: Run, sub: DataProto, now: torch.Tensor, diag: Diagnosis) -> bool:
    mask = sub.batch["response_mask"].bool()
    delta = (sub.batch["rollout_log_probs"].double() - now.double())[mask]
    differing = delta.abs() > _LOG_TOL
    if int(differing.sum()) < 4:
        return False
    above = float((delta[differing] > 0).double().mean())
    if above < _ONE_SIDED:
        return False
    rc = run.config.actor_rollout_ref.rollout
    diag.add("sampling", f"the rollout's log-probs are above the trainer's on {above:.0%} of the "
                         f"{int(differing.sum())} tokens that differ (never below): log-probs renormalised over a "
                         "truncated distribution "
                         f"(top_k={rc.top_k}, top_p={rc.top_p} in the run's sampling settings)")
    return True


def _check_reference(run: Run, sub: DataProto, gap_now: float, diag: Diagnosis) -> bool:
    """LoRA: the base model (reference) explains the rollout; otherwise the initial weights do (never synced)."""
    if not run.plan.use_ref or run.groups.ref is None:
        return False
    temperature = float(run.config.actor_rollout_ref.rollout.temperature)
    gap_ref = rows_gap(sub, trainer_log_probs(run, sub, temperature, reference=True))
    if gap_ref >= _TENFOLD * gap_now:
        return False
    if int(run.config.actor_rollout_ref.model.lora_rank or 0) > 0:
        diag.add("lora", f"the base model without the adapter matches the rollout (gap {gap_ref:.3g}) far better than "
                         f"the adapted actor ({gap_now:.3g}): the rollout generates without the LoRA adapter")
    else:
        diag.add("weights", f"the reference (initial) weights match the rollout (gap {gap_ref:.3g}) far better than "
                            f"the trainer's ({gap_now:.3g}): the rollout still holds the initial weights")
    return True


def _check_weight_facts(run: Run, diag: Diagnosis) -> bool:
    read = getattr(run.groups.rollout.fleet, "weight_facts", None) if run.groups.rollout is not None else None
    facts = read() if callable(read) else []
    bad = [f for f in facts if f.get("match") is False]
    for f in bad:
        diag.add("weights", f"engine {f.get('engine')}: weight digest {f.get('held')} != the trainer's "
                            f"{f.get('expected')} ({f.get('when')})")
    return bool(bad)


def diagnose(run: Run, batch: DataProto, gap: float | None, levels: DriftLevels, mismatch: float) -> Diagnosis:
    """The likely causes of a flagged step (see the module docstring)."""
    diag = Diagnosis()
    if mismatch > 0:
        diag.add("template", f"{mismatch:.0%} of the rows' prompt ids differ from the trainer's rendering of the same "
                             "rows (raw_prompt_ids: the dataset's chat template and tokenizer)")
    if gap is None or gap <= levels.warn:
        return diag
    found = _check_weight_facts(run, diag)
    sub = check_rows(run, batch) if "rollout_log_probs" in batch.batch else None
    if sub is None:
        return diag
    now = trainer_log_probs(run, sub, float(run.config.actor_rollout_ref.rollout.temperature))
    gap_now = max(rows_gap(sub, now), 1e-30)
    found |= _check_reference(run, sub, gap_now, diag)
    if not found:
        found = _check_temperature(run, sub, gap_now, diag) or _check_renormalised(run, sub, now, diag)
    if not found:
        diag.add("weights", f"a two-sided gap ({gap_now:.3g} on {len(sub)} rows recomputed now) with no sampling, "
                            "LoRA or template signature: what a stale weight version leaves")
    return diag


def describe_causes(names: Any) -> list[str]:
    """The words of each cause named (for the report)."""
    return [CAUSES[n] for n in names if n in CAUSES]
