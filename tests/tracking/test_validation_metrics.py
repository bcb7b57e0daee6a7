"""mean@N / best@N / maj@N / pass@k on hand examples, bootstrap determinism, core/aux naming."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.tracking.validation_metrics import (
    best_of_k,
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


def test_best_at_n_is_the_unbiased_estimator_not_the_bootstrap():
    """best@n over n of the N responses drawn without replacement (Chen et al. 2021); verl's bootstrap draws with
    replacement and reports 1 - (3/4)^4 = 0.68 for best@4 of a prompt answered right once in 4 -- but every
    4-subset of 4 answers holds the right one: best@4 is 1."""
    nested = compute_validation_group_metrics(["s"] * 4, ["q"] * 4, {"acc": [1, 0, 0, 0]}, seed=1)
    acc = nested["s"]["acc"]
    assert acc["mean@4"] == pytest.approx(0.25)
    assert acc["best@4/mean"] == 1.0 and acc["best@4/std"] == 0.0
    assert acc["best@2/mean"] == pytest.approx(0.5) == acc["pass@2"]  # 1 - C(3,2)/C(4,2)
    assert acc["best@2/std"] == pytest.approx(0.5)  # a 0/1 max with mean 1/2
    assert acc["worst@4/mean"] == 0.0 and acc["worst@2/mean"] == 0.0
    assert acc["std@4"] == pytest.approx(np.std([1, 0, 0, 0]))
    assert acc["pass@4"] == 1.0


# golden values, worked by hand: (values, k) -> E[max of k drawn without replacement], E[min]
GOLDEN = [
    ([0, 0, 1, 1], 2, 5 / 6, 1 / 6),  # pass@2 = 1 - C(2,2)/C(4,2); the bootstrap says 0.75
    ([1, 2, 3, 4], 2, (2 * 1 + 3 * 2 + 4 * 3) / 6, (1 * 3 + 2 * 2 + 3 * 1) / 6),  # 10/3, 5/3
    ([1, 2, 3, 4], 4, 4.0, 1.0),
    ([1, 2, 3, 4], 1, 2.5, 2.5),
    ([5, 5, 5], 2, 5.0, 5.0),
    ([0.5, -1.0, 2.0, 0.0, 1.0], 3, (0.5 * 1 + 1.0 * 3 + 2.0 * 6) / 10, (-1.0 * 6 + 0.0 * 3 + 0.5 * 1) / 10),
]


@pytest.mark.parametrize("values,k,best,worst", GOLDEN)
def test_best_and_worst_of_k_golden_values(values, k, best, worst):
    assert best_of_k(values, k)[0] == pytest.approx(best, abs=1e-12)
    assert best_of_k(values, k, worst=True)[0] == pytest.approx(worst, abs=1e-12)


def test_best_of_k_equals_pass_at_k_and_brute_force():
    import itertools
    from math import comb

    rng = np.random.default_rng(0)
    for n in (2, 5, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert best_of_k([1] * c + [0] * (n - c), k)[0] == pytest.approx(pass_at_k(n, c, k), abs=1e-12)
        values = rng.normal(size=n).tolist()
        for k in range(1, n + 1):
            maxima = [max(s) for s in itertools.combinations(values, k)]
            assert len(maxima) == comb(n, k)
            mean, std = best_of_k(values, k)
            assert mean == pytest.approx(np.mean(maxima)) and std == pytest.approx(np.std(maxima))
    # Chen et al.'s own numbers: n=10 samples, c=3 correct
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3) and pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    with pytest.raises(ValueError, match="k=3"):
        best_of_k([1, 0], 3)


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
