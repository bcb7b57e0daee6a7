"""verl 0.9's rollout-correction thresholds: IcePop ``lower_upper`` IS bounds, the k1/k2/k3 rejection criteria at
token and sequence level, several criteria at once (comma-separated, each with its own threshold), hand-computed."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms import compute_rollout_correction_weights
from hybridflow.algorithms.rollout_thresholds import ThresholdError, parse_is_threshold, parse_rejection

T = torch.tensor
# two sequences; w = pi_old / mu per token: row 0 = [1, 3, .5, (pad)], row 1 = [1.2, 1.1, .9, 1.05]
W = T([[1.0, 3.0, 0.5, 1.0], [1.2, 1.1, 0.9, 1.05]])
OLD = torch.zeros(2, 4)
ROLLOUT = -torch.log(W)
MASK = T([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def corr(**kw):
    kw.setdefault("rollout_is", None)
    return compute_rollout_correction_weights(OLD, ROLLOUT, MASK, **kw)


def test_icepop_zeroes_weights_outside_lower_upper_instead_of_capping():
    w, mask, m = corr(rollout_is="token", rollout_is_threshold="0.5_2.0")
    assert torch.allclose(w, T([[1.0, 0.0, 0.5, 0.0], [1.2, 1.1, 0.9, 1.05]]), atol=1e-6)  # 3 > 2: zeroed, not 2
    assert torch.equal(mask, MASK)  # IcePop changes weights only
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(1 / 7)
    w, _, _ = corr(rollout_is="token", rollout_is_threshold="0.6_4.0")  # .5 < .6: zeroed
    assert w[0, 2] == 0.0 and w[0, 1] == pytest.approx(3.0)
    capped, _, _ = corr(rollout_is="token", rollout_is_threshold=2.0)
    assert capped[0, 1] == pytest.approx(2.0)


def test_token_k1_bounds_mu_over_pi_old_asymmetrically():
    # k1 = -log w; '0.6_1.6' keeps mu/pi_old = 1/w in [.6, 1.6]: 1/3 (w=3) rejected, 1/.5 = 2 rejected, 1/1.2 = .83 kept
    _, mask, m = corr(rollout_rs="token_k1", rollout_rs_threshold="0.6_1.6")
    assert torch.equal(mask, T([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 7)
    # the bounds are not symmetric: '0.4_1.6' now keeps 1/3? no (.33 < .4); '0.3_2.0' keeps both
    _, mask, _ = corr(rollout_rs="token_k1", rollout_rs_threshold="0.3_2.0")
    assert torch.equal(mask, MASK)


def test_several_criteria_must_all_pass_each_with_its_threshold():
    # token_k1 in [.6, 1.6]  AND  seq_max_k2 <= t where k2 = (log w)^2 / 2
    k2 = [max(0.5 * math.log(x) ** 2 for x in row) for row in ((1.0, 3.0, 0.5), (1.2, 1.1, 0.9, 1.05))]
    assert k2[0] == pytest.approx(0.6035, abs=1e-4) and k2[1] < 0.02
    _, mask, m = corr(rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,2.5")
    assert torch.equal(mask, T([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))  # k1 alone decides
    _, mask, m = corr(rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.6_1.6,0.3")
    assert torch.equal(mask, T([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))  # row 0's max k2 .60 > .3: all of it
    assert m["rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction"] == 0.5
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 7)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 7)


def test_sequence_sum_mean_and_k3_statistics():
    logs = torch.log(W)
    k3 = W - 1 - logs
    # seq_mean_k3 of row 0 = mean(0, 3 - 1 - ln 3, .5 - 1 - ln .5)
    mean_k3_row0 = float((k3[0, :3]).mean())
    _, mask, m = corr(rollout_rs="seq_mean_k3", rollout_rs_threshold=mean_k3_row0 * 0.99)
    assert torch.equal(mask, T([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))
    # seq_sum_k1 = sum(-log w): row 0 = -ln 1.5 -> exp = 1/1.5 = .667 inside [.5, 2]; the legacy name 'sequence' is it
    _, a, _ = corr(rollout_rs="seq_sum_k1", rollout_rs_threshold=2.0)
    _, b, _ = corr(rollout_rs="sequence", rollout_rs_threshold=2.0)
    assert torch.equal(a, b) and torch.equal(a, MASK)
    _, a, _ = corr(rollout_rs="seq_sum_k1", rollout_rs_threshold="0.7_2.0")  # .667 < .7: row 0 rejected
    assert torch.equal(a, T([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))


@pytest.mark.parametrize("rs,threshold,message", [
    ("token_k1,seq_max_k2", "0.6_1.6,2.5,3", r"3 thresholds for the 2 criteria"),
    ("seq_max_k2", "0.5_2.0", r"one upper bound"),
    ("token_k1", "2.0_0.5", r"lower bound .* exceeds"),
    ("seq_max_k1", 2.0, r"unknown criterion 'seq_max_k1'"),
    ("token_k1", None, r"set algorithm.rollout_correction.rollout_rs_threshold"),
    ("token_k2", "-1", r"must be > 0"),
])
def test_bad_thresholds_name_the_key(rs, threshold, message):
    with pytest.raises(ThresholdError, match=message):
        parse_rejection(rs, threshold)


def test_is_threshold_grammar():
    assert parse_is_threshold(2.0) == (2.0, None) and parse_is_threshold("3") == (3.0, None)
    assert parse_is_threshold("0.5_4.0") == (4.0, 0.5)
    with pytest.raises(ThresholdError, match="rollout_is_threshold='abc'"):
        parse_is_threshold("abc")
