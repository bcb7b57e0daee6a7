"""mean@N / best@N / maj@N / pass@k on hand examples, bootstrap determinism, core/aux naming."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.tracking.validation_metrics import (
    bootstrap_metric,
    calc_maj_val,
    compute_validation_group_metrics,
    pass_at_k,
    process_validation_metrics,
)


def test_process_validation_metrics_exact_example():
    # prompt A: 4 correct answers "x"; prompt B: 4 wrong answers (2x "a", "b", "c"). Resampling cannot change
    # a constant group, so every estimate is exact: A -> 1, B -> 0, mean over prompts 0.5.
    sources = ["gsm8k"] * 8
    inputs = ["A"] * 4 + ["B"] * 4
    infos = {
        "acc": [1, 1, 1, 1, 0, 0, 0, 0],
        "reward": [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0],
        "pred": ["x", "x", "x", "x", "a", "a", "b", "c"],
    }
    m = process_validation_metrics(sources, inputs, infos, seed=0)
    assert m["val-core/gsm8k/acc/mean@4"] == pytest.approx(0.5)
    assert m["val-core/gsm8k/acc/best@4/mean"] == pytest.approx(0.5)
    assert m["val-core/gsm8k/acc/maj@4/mean"] == pytest.approx(0.5)
    # acc is the core variable, so reward and smaller n go to val-aux
    assert m["val-aux/gsm8k/reward/mean@4"] == pytest.approx(0.0)
    assert m["val-aux/gsm8k/acc/best@2/mean"] == pytest.approx(0.5)
    assert m["val-aux/gsm8k/acc/std@4"] == pytest.approx(0.0)
    assert m["val-aux/gsm8k/acc/worst@4/mean"] == pytest.approx(0.5)
    assert m["val-aux/gsm8k/acc/pass@4"] == pytest.approx(0.5)
    assert not any("/pred/" in k for k in m)  # strings are votes, not metrics
    assert not any(k.startswith("val-core/gsm8k/reward") for k in m)


def test_reward_is_core_without_acc_and_single_response():
    m = process_validation_metrics(["a", "b"], ["p1", "p2"], {"reward": [0.25, 0.75]})
    assert m == {"val-core/a/reward/mean@1": 0.25, "val-core/b/reward/mean@1": 0.75}


def test_best_at_n_bootstrap_close_to_closed_form():
    # one correct in four: E[max of 4 draws with replacement] = 1 - (3/4)^4 = 0.68359
    nested = compute_validation_group_metrics(["s"] * 4, ["q"] * 4, {"acc": [1, 0, 0, 0]}, seed=1)
    acc = nested["s"]["acc"]
    assert acc["mean@4"] == pytest.approx(0.25)
    assert acc["best@4/mean"] == pytest.approx(1 - 0.75**4, abs=0.05)
    assert acc["best@2/mean"] == pytest.approx(1 - 0.75**2, abs=0.05)
    assert acc["worst@4/mean"] == pytest.approx(0.25**4, abs=0.02)
    assert acc["std@4"] == pytest.approx(np.std([1, 0, 0, 0]))
    # unbiased pass@k (Chen et al. 2021): n=4, c=1 -> pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1
    assert acc["pass@2"] == pytest.approx(0.5) and acc["pass@4"] == 1.0


def test_pass_at_k_values_and_errors():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="n=3"):
        pass_at_k(3, 4, 1)


def test_bootstrap_deterministic_with_seed():
    data = [0.1, 0.7, 0.3, 0.9, 0.5]
    a = bootstrap_metric(data, 3, [np.max, np.mean], n_bootstrap=200, seed=7)
    b = bootstrap_metric(data, 3, [np.max, np.mean], n_bootstrap=200, seed=7)
    c = bootstrap_metric(data, 3, [np.max, np.mean], n_bootstrap=200, seed=8)
    assert a == b and a != c
    # the generic (per-row, list-input) path agrees with the vectorised one for the same seed
    generic = bootstrap_metric(data, 3, [lambda xs: max(xs)], n_bootstrap=200, seed=7)
    assert generic[0] == pytest.approx(a[0])
    state = np.random.get_state()[1].copy()
    bootstrap_metric(data, 2, [np.min], seed=3)
    assert (np.random.get_state()[1] == state).all()  # the global RNG is untouched


def test_calc_maj_val_ties_go_to_first_vote():
    assert calc_maj_val([{"p": "a", "v": 1}, {"p": "b", "v": 0}], "p", "v") == 1
    assert calc_maj_val([{"p": "b", "v": 0}, {"p": "a", "v": 1}, {"p": "a", "v": 1}], "p", "v") == 1
    assert calc_maj_val([{"p": [1, 2], "v": 3}, {"p": [1, 2], "v": 3}, {"p": [2], "v": 0}], "p", "v") == 3


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="infos_dict\\['acc'\\]"):
        process_validation_metrics(["a", "a"], ["p", "p"], {"acc": [1]})
