"""Validation metrics with several responses per prompt: mean@N, best@N, worst@N, maj@N, pass@k.

For every data source and every per-sample variable (``reward``, ``acc``, ``pred``, anything a reward
function returned in its dict), samples are grouped by prompt; each group of N responses gives
``mean@N`` and ``std@N``, and for n = 2, 4, 8, ... < N and n = N:

* ``best@n`` / ``worst@n``: the expected max / min of the variable over n of the N responses drawn *without*
  replacement, computed exactly (the unbiased estimator of Chen et al. 2021 generalised to any variable: with the
  values sorted ascending, ``E[max] = sum_i C(i-1, n-1) / C(N, n) * v_(i)``), and its standard deviation over
  those subsets. For a 0/1 ``acc`` ``best@n/mean`` *is* ``pass@n`` (eq. 1 of Chen et al.). verl's bootstrap
  draws n responses *with* replacement, which repeats responses and reports best@n biased low (verl PR #7240:
  for N=4 responses of which 2 are right, best@2 = 0.75 instead of 5/6);
* ``maj@n``: value of the majority-voted prediction (self-consistency, Wang et al. 2022) when a ``pred``
  variable exists, a bootstrap estimate (Efron 1979) over n responses drawn with replacement,

then means over prompts. Names and the core/aux split follow verl: ``val-core/<source>/<var>/<metric>`` holds
``mean@N``, ``best@N/*`` and ``maj@N/*`` at the largest N of the core variable (``acc`` if reported, else
``reward``); everything else goes to ``val-aux/...``. For 0/1 variables ``pass@k`` (the same estimator) is added
to ``val-aux``.
"""

from __future__ import annotations

from collections import defaultdict
from math import comb
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

__all__ = [
    "bootstrap_metric",
    "best_of_k",
    "calc_maj_val",
    "pass_at_k",
    "compute_validation_group_metrics",
    "process_validation_metrics",
]

_VECTORISED = {np.max: np.max, np.min: np.min, np.mean: np.mean, max: np.max, min: np.min}


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[Any], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """(mean, std) over ``n_bootstrap`` resamples of ``subset_size`` items (with replacement) of each reduce_fn.

    Deterministic for a given ``seed`` (a private generator: the global numpy RNG is left alone). numpy
    reductions over numeric data run vectorised; any other reduce_fn receives a list of items.
    """
    if len(data) == 0:
        raise ValueError("bootstrap_metric needs at least one data point")
    if subset_size < 1:
        raise ValueError(f"bootstrap_metric subset_size must be >= 1, got {subset_size}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(data), size=(n_bootstrap, subset_size))
    numeric = all(isinstance(d, (int, float, bool, np.number)) for d in data)
    arr = np.asarray(data, dtype=np.float64)[idx] if numeric else None
    results = []
    for fn in reduce_fns:
        if arr is not None and fn in _VECTORISED:
            samples = _VECTORISED[fn](arr, axis=1)
        else:
            samples = np.asarray([fn([data[i] for i in row]) for row in idx], dtype=np.float64)
        results.append((float(np.mean(samples)), float(np.std(samples))))
    return results


def calc_maj_val(data: Sequence[Mapping[str, Any]], vote_key: str, val_key: str) -> float:
    """``val_key`` of the most frequent ``vote_key``; ties go to the vote seen first (as verl)."""
    votes: dict[Hashable, list[Any]] = {}
    for d in data:
        votes.setdefault(_hashable(d[vote_key]), []).append(d[val_key])
    winner = max(votes, key=lambda v: len(votes[v]))
    return votes[winner][0]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k) / C(n, k) (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def best_of_k(values: Sequence[float], k: int, worst: bool = False) -> tuple[float, float]:
    """(mean, std) of the max (``worst``: min) of ``k`` of the ``values`` drawn without replacement, exactly:
    the i-th smallest value is the max of ``C(i-1, k-1)`` of the ``C(n, k)`` subsets (unbiased; for 0/1 values the
    mean is :func:`pass_at_k`)."""
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"best_of_k needs 1 <= k <= len(values), got k={k} for {n} values")
    v = sorted((float(x) for x in values), reverse=worst)
    total = comb(n, k)
    weights = [comb(i, k - 1) / total for i in range(n)]  # value v[i] is the extreme of C(i, k-1) subsets
    mean = sum(w * x for w, x in zip(weights, v))
    second = sum(w * x * x for w, x in zip(weights, v))
    return mean, float(np.sqrt(max(0.0, second - mean * mean)))


def _hashable(x: Any) -> Hashable:
    try:
        hash(x)
        return x
    except TypeError:
        return repr(x)


def _subset_sizes(n_resps: int) -> list[int]:
    sizes, n = [], 2
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return sizes + [n_resps]


def _is_numeric_list(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float, bool, np.number)) and not isinstance(v, str) for v in values)


def _group_metrics(var_vals: list[Any], preds: list[Any] | None, seed: int) -> dict[str, float]:
    n_resps = len(var_vals)
    metric = {f"mean@{n_resps}": float(np.mean(var_vals))}
    if n_resps == 1:
        return metric
    metric[f"std@{n_resps}"] = float(np.std(var_vals))
    for n in _subset_sizes(n_resps):
        (bon_m, bon_s), (won_m, won_s) = best_of_k(var_vals, n), best_of_k(var_vals, n, worst=True)
        metric |= {f"best@{n}/mean": bon_m, f"best@{n}/std": bon_s, f"worst@{n}/mean": won_m, f"worst@{n}/std": won_s}
        if preds is not None:
            votes = [{"val": v, "pred": p} for v, p in zip(var_vals, preds)]
            maj = lambda rows: calc_maj_val(rows, vote_key="pred", val_key="val")  # noqa: E731
            [(maj_m, maj_s)] = bootstrap_metric(votes, n, [maj], seed=seed)
            metric |= {f"maj@{n}/mean": maj_m, f"maj@{n}/std": maj_s}
    if all(v in (0, 1) for v in var_vals):
        c = int(sum(var_vals))
        for k in _subset_sizes(n_resps):
            metric[f"pass@{k}"] = pass_at_k(n_resps, c, k)
    return metric


def _nested_lists() -> defaultdict:
    """``d[a][b][c]`` auto-creates the levels and ends in a list."""
    return defaultdict(lambda: defaultdict(lambda: defaultdict(list)))


def compute_validation_group_metrics(
    data_sources: Sequence[str],
    sample_inputs: Sequence[Hashable],
    infos_dict: Mapping[str, Sequence[Any]],
    seed: int = 42,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {var: {metric: value}}}``, each value the mean over prompts of the per-prompt metric.

    ``sample_inputs`` identifies the prompt of each sample (the prompt text or a ``uid``); ``infos_dict`` maps
    variable name -> one value per sample. Non-numeric variables (e.g. ``pred`` strings) are used for voting only.
    """
    n = len(data_sources)
    if len(sample_inputs) != n:
        raise ValueError(
            f"sample_inputs has {len(sample_inputs)} entries but data_sources has {n}; give one per sample"
        )
    for name, vals in infos_dict.items():
        if len(vals) != n:
            raise ValueError(
                f"infos_dict['{name}'] has {len(vals)} values but there are {n} samples; give one per sample"
            )
    grouped: dict[str, dict[Hashable, dict[str, list[Any]]]] = _nested_lists()
    for i, source in enumerate(data_sources):
        var2vals = grouped[source][_hashable(sample_inputs[i])]
        for name, vals in infos_dict.items():
            var2vals[name].append(vals[i])

    per_metric: dict[str, dict[str, dict[str, list[float]]]] = _nested_lists()
    for source, prompts in grouped.items():
        for var2vals in prompts.values():
            preds = var2vals.get("pred")
            for name, vals in var2vals.items():
                if not _is_numeric_list(vals):
                    continue
                for metric_name, value in _group_metrics(vals, preds, seed).items():
                    per_metric[source][name][metric_name].append(value)
    return {
        source: {var: {m: float(np.mean(v)) for m, v in metrics.items()} for var, metrics in var2metric.items()}
        for source, var2metric in per_metric.items()
    }


def _metric_n(metric_name: str) -> int:
    return int(metric_name.split("@")[-1].split("/")[0])


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_inputs: Sequence[Hashable],
    infos_dict: Mapping[str, Sequence[Any]],
    seed: int = 42,
) -> dict[str, float]:
    """Flat ``val-core/<source>/<var>/<metric>`` and ``val-aux/...`` metrics, ready to log (see module doc)."""
    nested = compute_validation_group_metrics(data_sources, sample_inputs, infos_dict, seed)
    flat: dict[str, float] = {}
    for source, var2metric in nested.items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var, metrics in var2metric.items():
            n_max = max(_metric_n(m) for m in metrics)
            for metric_name, value in metrics.items():
                is_core = (
                    var == core_var
                    and metric_name.startswith(("mean", "maj", "best"))
                    and _metric_n(metric_name) == n_max
                )
                flat[f"{'val-core' if is_core else 'val-aux'}/{source}/{var}/{metric_name}"] = value
    return flat
