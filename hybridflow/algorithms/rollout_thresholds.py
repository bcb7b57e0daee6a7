"""The threshold grammar of ``algorithm.rollout_correction`` (verl 0.9's), parsed once into plain values.

* ``rollout_is_threshold``: a number t (truncated IS: weights capped at t) or a ``"lower_upper"`` string such as
  ``"0.5_4.0"`` (IcePop: weights outside [lower, upper] are zeroed, the rest kept as they are).
* ``rollout_rs``: one rejection criterion or several, comma-separated (a token must pass all of them), each
  ``<level>_<estimator>`` over the per-token log-ratio log r = log pi_old - log mu:

  ========== ============================================ ==================================
  level      statistic                                    estimators
  ========== ============================================ ==================================
  token      each token's own value                       k1, k2, k3
  seq_sum    sum over the sequence's response tokens      k1, k2, k3
  seq_mean   mean over them                               k1, k2, k3
  seq_max    maximum over them                            k2, k3
  ========== ============================================ ==================================

  with k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r (the three KL(mu || pi_old) estimators).  The older
  single-level names mean the k1 criteria: ``token`` = ``token_k1``, ``sequence`` = ``seq_sum_k1`` (the product of
  the ratios), ``geometric`` = ``seq_mean_k1`` (their geometric mean).
* ``rollout_rs_threshold``: one entry per criterion, comma-separated (a single entry applies to every criterion).
  A k1 criterion takes ``"lower_upper"`` bounds on exp(k1) = mu / pi_old (a single number u means [1/u, u]); k2 and
  k3 criteria take one upper bound.  So ``rollout_rs='token_k1,seq_max_k2' rollout_rs_threshold='0.6_1.6,2.5'``
  keeps a token when 0.6 <= mu/pi_old <= 1.6 and no token of its sequence has (log r)^2 / 2 > 2.5.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LEGACY_RS_LEVELS", "RS_OPTIONS", "RejectionRule", "ThresholdError", "parse_is_threshold",
           "parse_rejection"]

IS_KEY = "algorithm.rollout_correction.rollout_is_threshold"
RS_KEY = "algorithm.rollout_correction.rollout_rs"
RS_THRESHOLD_KEY = "algorithm.rollout_correction.rollout_rs_threshold"

LEGACY_RS_LEVELS = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


class ThresholdError(ValueError):
    """A rollout-correction setting that cannot be read (the message names the key and what it accepts)."""


@dataclass(frozen=True)
class RejectionRule:
    """One rejection criterion: ``reduce`` is None (per token), ``sum``, ``mean`` or ``max`` over a sequence;
    ``lower`` / ``upper`` bound exp(k1) for ``k1`` (both set), the statistic itself for k2 / k3 (``upper`` only)."""

    option: str
    reduce: str | None
    estimator: str
    lower: float | None
    upper: float

    @property
    def level(self) -> str:
        return "token" if self.reduce is None else "sequence"


def _number(text, key: str, what: str) -> float:
    if isinstance(text, bool):
        raise ThresholdError(f"{key}={text!r}: {what}")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ThresholdError(f"{key}={text!r}: {what}") from None
    if not value > 0:
        raise ThresholdError(f"{key}={text!r}: bounds must be > 0 ({what})")
    return value


def parse_is_threshold(spec) -> tuple[float, float | None]:
    """``(upper, lower)`` of ``rollout_is_threshold``; ``lower`` is None for a single number (truncation)."""
    what = "give a number t > 0 (weights capped at t) or 'lower_upper' such as '0.5_4.0' (IcePop: weights outside zeroed)"
    if isinstance(spec, str) and "_" in spec:
        low_text, _, high_text = spec.strip().partition("_")
        lower, upper = _number(low_text, IS_KEY, what), _number(high_text, IS_KEY, what)
        if lower > upper:
            raise ThresholdError(f"{IS_KEY}={spec!r}: the lower bound exceeds the upper one")
        return upper, lower
    return _number(spec, IS_KEY, what), None


def _options(rollout_rs) -> list[str]:
    names = [part.strip() for part in str(rollout_rs).split(",") if part.strip()]
    out: list[str] = []
    for name in names:
        name = LEGACY_RS_LEVELS.get(name, name)
        if name not in RS_OPTIONS:
            raise ThresholdError(f"{RS_KEY}={rollout_rs!r}: unknown criterion '{name}'; choose null or comma-separated "
                                 f"criteria among {', '.join(RS_OPTIONS)} (or token, sequence, geometric)")
        if name not in out:
            out.append(name)
    if not out:
        raise ThresholdError(f"{RS_KEY}={rollout_rs!r}: name at least one criterion, or set it to null")
    return out


def _rule(option: str, spec: str) -> RejectionRule:
    level, _, estimator = option.rpartition("_")
    reduce = None if level == "token" else level.removeprefix("seq_")
    if estimator == "k1":
        what = f"{option} takes 'lower_upper' bounds on mu/pi_old (e.g. '0.6_1.6') or one number u for [1/u, u]"
        if "_" in spec:
            low_text, _, high_text = spec.partition("_")
            lower, upper = _number(low_text, RS_THRESHOLD_KEY, what), _number(high_text, RS_THRESHOLD_KEY, what)
        else:
            upper = _number(spec, RS_THRESHOLD_KEY, what)
            lower = 1.0 / upper
        if lower > upper:
            raise ThresholdError(f"{RS_THRESHOLD_KEY}: {option}'s lower bound {lower} exceeds its upper bound {upper}")
        return RejectionRule(option, reduce, estimator, lower, upper)
    what = f"{option} takes one upper bound on its statistic (a number > 0, no 'lower_upper')"
    if "_" in spec:
        raise ThresholdError(f"{RS_THRESHOLD_KEY}={spec!r}: {what}")
    return RejectionRule(option, reduce, estimator, None, _number(spec, RS_THRESHOLD_KEY, what))


def parse_rejection(rollout_rs, threshold) -> list[RejectionRule]:
    """The criteria of ``rollout_rs`` with their bounds (``[]`` when ``rollout_rs`` is null)."""
    if rollout_rs is None:
        return []
    options = _options(rollout_rs)
    if threshold is None:
        raise ThresholdError(f"{RS_KEY}={rollout_rs} rejects outliers: set {RS_THRESHOLD_KEY} (e.g. 2.0, or "
                             "'0.6_1.6' for k1 criteria)")
    specs = [part.strip() for part in str(threshold).split(",") if part.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ThresholdError(f"{RS_THRESHOLD_KEY}={threshold!r} gives {len(specs)} thresholds for the "
                             f"{len(options)} criteria of {RS_KEY}={rollout_rs!r}: give one, or one per criterion")
    return [_rule(option, spec) for option, spec in zip(options, specs)]
