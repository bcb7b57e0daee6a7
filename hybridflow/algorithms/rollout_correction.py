"""Train/rollout mismatch correction: truncated importance sampling and rejection of outliers.

The rollout engine (vLLM/SGLang, bf16, different kernels) samples from a policy μ that is not exactly
the trainer's π_old, so on-policy losses are silently off-policy.  With
log w_t = log π_old(y_t) − log μ(y_t) (``old_log_prob − rollout_log_probs``):

* Truncated IS (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
  training", https://fengyao.notion.site/off-policy-rl): w is capped at ``rollout_is_threshold`` and
  multiplies the per-token policy loss (``rollout_is_weights``).  ``token`` level uses w_t (biased, low
  variance); ``sequence`` level the product Π_t w_t (unbiased, high variance).  A ``"lower_upper"`` threshold
  (verl 0.9's IcePop form, e.g. ``"0.5_4.0"``) zeroes the weights outside [lower, upper] instead of capping them.
* Rejection (masked IS, Liu et al. 2025, "When speed kills stability", https://richardli.xyz/rl-collapse):
  tokens or whole sequences failing any of the ``rollout_rs`` criteria (k1 / k2 / k3 divergence estimators per
  token, or summed / averaged / maximised over the sequence; grammar in :mod:`.rollout_thresholds`) are removed
  from ``response_mask``.
* Veto: a sequence containing any token with w_t < ``rollout_token_veto_threshold`` is rejected whole.

All exponentials clamp the log-ratio to [−20, 20].  Weights are detached (they change the measure,
not the objective).
"""

from __future__ import annotations

import math

import torch

from .masked import masked_mean, masked_sum
from .rollout_thresholds import LEGACY_RS_LEVELS, RejectionRule, parse_is_threshold, parse_rejection

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_LEVELS",
    "compute_rollout_is_weights",
    "compute_rollout_rejection_mask",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_weights",
    "rollout_probs_diff",
    "rollout_probs_diff_sums",
    "rollout_probs_diff_from_sums",
    "PROBS_DIFF_SUM_KEYS",
]

ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_LEVELS = tuple(LEGACY_RS_LEVELS)  # the older single-level names (see .rollout_thresholds)
_BOUND = 20.0


def _aggregated_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    if level == "token":
        return log_ratio
    if level == "sequence":
        return masked_sum(log_ratio, mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)
    if level == "geometric":
        return masked_mean(log_ratio, mask, axis=-1).unsqueeze(-1).expand_as(log_ratio)
    raise ValueError(f"unknown aggregation level '{level}'")


def compute_rollout_is_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: float | str = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IS weights w at token or sequence level, zero on masked positions: truncated at t for a number t, or -- for a
    ``"lower_upper"`` threshold (IcePop) -- kept as they are inside [lower, upper] and zeroed outside."""
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(
            f"algorithm.rollout_correction.rollout_is must be null or one of {ROLLOUT_IS_LEVELS}, got '{rollout_is}'"
        )
    upper, lower = parse_is_threshold(rollout_is_threshold)
    mask = response_mask.bool()
    raw = _aggregated_log_ratio(log_ratio, mask, rollout_is).clamp(-_BOUND, _BOUND).exp()
    if lower is None:
        weights = torch.where(mask, raw.clamp(max=upper), 0.0).detach()
    else:
        weights = torch.where(mask & (raw >= lower) & (raw <= upper), raw, 0.0).detach()
    metrics = {
        "rollout_is_mean": masked_mean(weights, mask).item(),
        "rollout_is_max": weights.masked_fill(~mask, float("-inf")).max().item(),
        "rollout_is_min": weights.masked_fill(~mask, float("inf")).min().item(),
        "rollout_is_fraction_truncated": masked_mean((raw > upper).float(), mask).item(),
    }
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(((raw < lower) | (raw > upper)).float(), mask).item()
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            has_tokens = mask.any(dim=-1)
            mean = masked_mean(weights, mask, axis=-1)[has_tokens].mean()
        if mean > 1e-8:
            weights = weights / mean
        metrics["rollout_is_batch_norm_factor"] = float(mean)
    return weights, metrics


def _statistic(rule: RejectionRule, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rule's statistic per token (a sequence statistic broadcast over the sequence's tokens)."""
    safe = log_ratio.clamp(-_BOUND, _BOUND)
    per_token = {"k1": -safe, "k2": 0.5 * safe * safe, "k3": safe.exp() - 1.0 - safe}[rule.estimator]
    if rule.reduce is None:
        return per_token
    if rule.reduce == "sum":
        seq = masked_sum(per_token, mask, axis=-1)
    elif rule.reduce == "mean":
        seq = masked_mean(per_token, mask, axis=-1)
    else:
        seq = per_token.masked_fill(~mask, float("-inf")).max(dim=-1).values
        seq = torch.where(mask.any(dim=-1), seq, 0.0)
    return seq.unsqueeze(-1).expand_as(per_token)


def _keeps(rule: RejectionRule, stat: torch.Tensor) -> torch.Tensor:
    if rule.estimator == "k1":  # bounds on exp(k1) = mu / pi_old, compared in log space
        return (stat >= math.log(rule.lower)) & (stat <= math.log(rule.upper))
    return stat <= rule.upper


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: float | str | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with every token (or sequence) that fails one of the ``rollout_rs`` criteria set to 0 (the
    grammar: :mod:`.rollout_thresholds`); per-criterion and overall masked fractions as metrics."""
    rules = parse_rejection(rollout_rs, rollout_rs_threshold)
    mask = response_mask.bool()
    keep_all = torch.ones_like(mask)
    metrics: dict[str, float] = {}
    for rule in rules:
        stat = _statistic(rule, log_ratio, mask)
        keep = _keeps(rule, stat) | ~mask
        keep_all &= keep
        prefix = f"rollout_rs_{rule.option}"
        metrics[f"{prefix}_mean"] = masked_mean(stat, mask).item()
        metrics[f"{prefix}_max"] = stat.masked_fill(~mask, float("-inf")).max().item() if mask.any() else 0.0
        metrics[f"{prefix}_masked_fraction"] = masked_mean((~keep).float(), mask).item()
        metrics[f"{prefix}_seq_masked_fraction"] = (~keep & mask).any(dim=-1).float().mean().item()
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep_all).float(), mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (~keep_all & mask).any(dim=-1).float().mean().item()
    return (mask & keep_all).to(response_mask.dtype), metrics


# Sufficient statistics of the train/rollout probability gap: additive over micro-batches and data-parallel
# ranks (``max`` excepted, which reduces by max), so a worker can report the whole batch's numbers.
PROBS_DIFF_SUM_KEYS = ("n", "sum_d", "sum_d2", "sum_r", "sum_a", "sum_r2", "sum_a2", "sum_ra")


def rollout_probs_diff_sums(
    rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Per-batch sums (keys ``PROBS_DIFF_SUM_KEYS`` plus ``max_d``) of the probabilities p = exp(log-prob) of the
    produced tokens (``response_mask == 1``); combine pieces by adding (``max_d``: maximum), then call
    :func:`rollout_probs_diff_from_sums`."""
    mask = response_mask.bool()
    r = torch.masked_select(rollout_log_probs.detach().double(), mask).exp()
    a = torch.masked_select(actor_log_probs.detach().double(), mask).exp()
    d = (r - a).abs()
    sums = {"n": torch.tensor(float(d.numel()), dtype=torch.float64, device=d.device), "sum_d": d.sum(),
            "sum_d2": (d * d).sum(), "sum_r": r.sum(), "sum_a": a.sum(), "sum_r2": (r * r).sum(),
            "sum_a2": (a * a).sum(), "sum_ra": (r * a).sum()}
    sums["max_d"] = d.max() if d.numel() else torch.zeros((), dtype=torch.float64, device=d.device)
    return sums


def rollout_probs_diff_from_sums(sums: dict[str, float | torch.Tensor]) -> dict[str, float]:
    """verl's ``training/rollout_probs_diff_{valid,max,mean,std}`` and ``training/rollout_actor_probs_pearson_corr``
    from :func:`rollout_probs_diff_sums` (std unbiased; the correlation left out when either side is constant)."""
    v = {k: float(x) for k, x in sums.items()}
    n = v["n"]
    if n == 0:
        return {"training/rollout_probs_diff_valid": 0.0}
    mean = v["sum_d"] / n
    var = max(v["sum_d2"] - n * mean * mean, 0.0) / (n - 1) if n > 1 else 0.0
    metrics = {
        "training/rollout_probs_diff_valid": 1.0,
        "training/rollout_probs_diff_max": v["max_d"],
        "training/rollout_probs_diff_mean": mean,
        "training/rollout_probs_diff_std": var ** 0.5,
    }
    cov = v["sum_ra"] - v["sum_r"] * v["sum_a"] / n
    var_r = v["sum_r2"] - v["sum_r"] ** 2 / n
    var_a = v["sum_a2"] - v["sum_a"] ** 2 / n
    if n > 1 and var_r > 1e-24 and var_a > 1e-24:
        metrics["training/rollout_actor_probs_pearson_corr"] = cov / (var_r * var_a) ** 0.5
    return metrics


def rollout_probs_diff(
    rollout_log_probs: torch.Tensor, actor_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Train/rollout mismatch on the tokens the model produced: |p_rollout - p_actor| per token (max, mean, std)
    and the Pearson correlation of the two probabilities (verl's ``training/rollout_probs_diff_*`` and
    ``training/rollout_actor_probs_pearson_corr``).  Tokens with ``response_mask == 0`` (padding, tool output)
    are left out.  An empty mask gives ``{"training/rollout_probs_diff_valid": 0.0}``."""
    return rollout_probs_diff_from_sums(rollout_probs_diff_sums(rollout_log_probs, actor_log_probs, response_mask))


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Mismatch diagnostics: KL(μ‖π_old) by k1 and k3 over valid tokens, and the mean per-sequence
    difference of log-perplexities (training minus rollout)."""
    mask = response_mask.bool()
    delta = rollout_log_prob - old_log_prob  # log μ − log π on samples from μ
    k3 = (-delta).clamp(-_BOUND, _BOUND).exp() - 1.0 + delta
    has_tokens = mask.any(dim=-1)
    log_ppl_train = -masked_mean(old_log_prob, mask, axis=-1)
    log_ppl_rollout = -masked_mean(rollout_log_prob, mask, axis=-1)
    return {
        "kl": masked_mean(delta, mask).item(),
        "k3_kl": masked_mean(k3, mask).item(),
        "log_ppl_diff": (log_ppl_train - log_ppl_rollout)[has_tokens].mean().item() if has_tokens.any() else 0.0,
    }


def compute_rollout_correction_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = "token",
    rollout_is_threshold: float | str = 2.0,
    rollout_rs: str | None = None,
    rollout_rs_threshold: float | str | None = None,
    rollout_token_veto_threshold: float | None = None,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights, rejection and veto in one call (names as ``algorithm.rollout_correction.*``).

    Returns ``(rollout_is_weights or None, response_mask after rejection/veto, metrics)`` with metric
    names prefixed ``rollout_corr/``.  The weights are computed on the original mask and then zeroed
    wherever the new mask rejects a token.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_probs {tuple(rollout_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have the same (B, R) shape"
        )
    log_ratio = (old_log_prob - rollout_log_prob).detach()
    metrics = compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask)
    new_mask = response_mask
    if rollout_rs is not None:
        new_mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    if rollout_token_veto_threshold is not None:
        mask = response_mask.bool()
        token_ratio = log_ratio.clamp(-_BOUND, _BOUND).exp()
        vetoed = (mask & (token_ratio < rollout_token_veto_threshold)).any(dim=-1, keepdim=True)
        new_mask = torch.where(vetoed, torch.zeros_like(new_mask), new_mask)
        metrics["rollout_veto_fraction"] = vetoed.float().mean().item()
    weights = None
    if rollout_is is not None:
        weights, is_metrics = compute_rollout_is_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        weights = torch.where(new_mask.bool(), weights, 0.0)
        metrics.update(is_metrics)
    return weights, new_mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}
