"""The rollout-correction stage: reweight or reject tokens the rollout sampled from a different policy.

The rollout engine samples from μ (its own kernels, precision or quantised weights), the actor computes
π_old for the same tokens; their ratio is the off-policyness the PPO ratio never sees.  With
``algorithm.rollout_correction.rollout_is`` set, truncated importance-sampling weights min(π_old/μ, C)
(Yao et al. 2025, TIS) multiply the per-token policy loss; with ``rollout_rs`` set, tokens or sequences
whose ratio leaves the trust band are removed from ``response_mask`` (Liu et al. 2025).  The formulas live
in :mod:`hybridflow.algorithms.rollout_correction`; this module only decides when they apply and writes
the result into the batch keys the actor reads (``rollout_is_weights``, ``response_mask``).

It runs after the advantages and before the updates: every sample's score still enters its group's
baseline (a rejected sample is still evidence about how hard the prompt is), while rejection removes the
off-policy tokens from the losses.  It needs the rollout's own log-probs
(``actor_rollout_ref.rollout.calculate_log_probs=true``); without them the stage fails with that fix
rather than silently training uncorrected.
"""

from __future__ import annotations

from hybridflow.algorithms.rollout_correction import compute_rollout_correction_weights
from hybridflow.protocol import DataProto

__all__ = ["correction_enabled", "apply_rollout_correction"]


def correction_enabled(rc) -> bool:
    """True when ``algorithm.rollout_correction`` asks for IS weights or rejection between pi_old and mu in this
    stage (decoupled mode).  In bypass mode the actor's loss corrects against the policy being trained instead
    (``algorithms/bypass_loss.py``), so this stage does not run."""
    return (rc.rollout_is is not None or rc.rollout_rs is not None) and not rc.bypass_mode


def apply_rollout_correction(batch: DataProto, rc) -> dict[str, float]:
    """Add ``rollout_is_weights`` and/or narrow ``response_mask`` in place; return ``rollout_corr/*`` metrics.

    ``rc`` is ``config.algorithm.rollout_correction``.  A no-op (empty metrics) when neither
    ``rollout_is`` nor ``rollout_rs`` is set.
    """
    if not correction_enabled(rc):
        return {}
    if "rollout_log_probs" not in batch.batch:
        raise ValueError(
            "algorithm.rollout_correction needs the rollout's log-probs of its samples, and this batch has no "
            "'rollout_log_probs'; set actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if "old_log_probs" not in batch.batch:
        raise ValueError("algorithm.rollout_correction runs after the old log-prob stage; the batch has no "
                         "'old_log_probs' (the trainer must not skip that stage when correction is on)")
    weights, mask, metrics = compute_rollout_correction_weights(
        batch.batch["old_log_probs"],
        batch.batch["rollout_log_probs"],
        batch.batch["response_mask"],
        rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold,
        rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
    )
    if weights is not None:
        batch.batch["rollout_is_weights"] = weights
    batch.batch["response_mask"] = mask.to(batch.batch["response_mask"].dtype)
    return metrics
