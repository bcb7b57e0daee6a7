"""Value loss, entropy/log-probs, PF-PPO, DAPO overlong penalty and rollout correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    compute_overlong_penalty,
    compute_pf_ppo_reweight_data,
    compute_rollout_correction_weights,
    compute_value_loss,
    entropy_from_logits,
    entropy_from_logits_with_chunking,
    logprobs_from_logits,
)
from hybridflow.algorithms.pf_ppo import compute_pf_ppo_weights
from hybridflow.protocol import DataProto

T = torch.tensor


# ---------------------------------------------------------------------------------------------- value loss
def test_value_loss_clipping_hand_computed():
    # V = [1, 1.9], V_old = [.5, 2], R = [2, 1], c = .2 → V_clip = [.7, 1.9]
    # tok0: max((1−2)², (.7−2)²) = max(1, 1.69) = 1.69 (clipped wins);  tok1: .81 both
    # loss = ½ · (1.69 + .81)/2 = .625; clipfrac 1/2
    loss, clipfrac = compute_value_loss(T([[1.0, 1.9]]), T([[2.0, 1.0]]), T([[0.5, 2.0]]), T([[1.0, 1.0]]), 0.2)
    assert loss.item() == pytest.approx(0.625, abs=1e-6)
    assert clipfrac.item() == 0.5


def test_value_loss_gradient():
    # V = .5, V_old = .6, R = 2, c = .05 → V_clip = .55: (.5−2)² = 2.25 > (.55−2)² = 2.1025, unclipped wins
    # d/dV ½(V−R)² = V − R = −1.5;  the saturated clipped branch would give 0
    v = T([[0.5]], requires_grad=True)
    loss, clipfrac = compute_value_loss(v, T([[2.0]]), T([[0.6]]), T([[1.0]]), 0.05)
    loss.backward()
    assert loss.item() == pytest.approx(1.125) and v.grad.item() == pytest.approx(-1.5) and clipfrac.item() == 0.0
    v = T([[1.0]], requires_grad=True)  # V_old = .5, R = 2: clipped branch (.7 − 2)² wins, constant in V
    compute_value_loss(v, T([[2.0]]), T([[0.5]]), T([[1.0]]), 0.2)[0].backward()
    assert v.grad.item() == 0.0


# ---------------------------------------------------------------------------------------------- entropy / logprobs
def test_entropy_and_logprobs_hand_computed():
    # softmax([0, ln 3]) = [.25, .75]: H = −(.25 ln .25 + .75 ln .75); log p(1) = ln .75; uniform over 4: ln 4
    logits = T([[0.0, math.log(3.0)], [0.0, 0.0]])
    h = entropy_from_logits(logits)
    assert h[0].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    assert h[1].item() == pytest.approx(math.log(2.0), abs=1e-6)
    assert entropy_from_logits(torch.zeros(1, 4)).item() == pytest.approx(math.log(4.0), abs=1e-6)
    lp = logprobs_from_logits(logits, T([1, 0]))
    assert torch.allclose(lp, T([math.log(0.75), math.log(0.5)]), atol=1e-6)


def test_chunked_forms_match_full():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    assert torch.allclose(entropy_from_logits_with_chunking(logits, chunk_size=3), entropy_from_logits(logits), atol=1e-6)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    assert torch.allclose(logprobs_from_logits(logits, labels, chunk_size=3), ref, atol=1e-6)
    bf16 = logprobs_from_logits(logits.bfloat16(), labels)
    assert bf16.dtype == torch.float32


# ---------------------------------------------------------------------------------------------- PF-PPO
def test_pf_ppo_weights_hand_computed():
    scores = T([-2.0, 1.0, 0.0])
    assert torch.allclose(compute_pf_ppo_weights(scores, "pow", 2.0), T([4.0, 1.0, 0.0]) + 1e-8)
    assert torch.allclose(compute_pf_ppo_weights(scores, "max_min", 2.0), T([1.0, 1.0, 0.0]) + 1e-8)
    assert torch.allclose(compute_pf_ppo_weights(scores, "max_random", 2.0), T([0.1, 0.4, 0.1]) + 1e-8)
    with pytest.raises(ValueError, match="reweight_method"):
        compute_pf_ppo_weights(scores, "top", 2.0)


def test_pf_ppo_resampling_is_seeded_and_keeps_rows_whole():
    scores = T([[0.0, 0.0], [0.0, 1.0], [0.5, 0.0], [0.0, 0.25]])
    data = DataProto.from_dict(
        {"token_level_scores": scores, "row": torch.arange(4)}, {"uid": np.array(list("abcd"), dtype=object)}, {"k": 1}
    )
    a = compute_pf_ppo_reweight_data(data, "max_min", 2.0, seed=7)
    b = compute_pf_ppo_reweight_data(data, "max_min", 2.0, seed=7)
    assert torch.equal(a.batch["row"], b.batch["row"]) and len(a) == 4 and a.meta_info == {"k": 1}
    assert set(a.batch["row"].tolist()) <= {0, 1}  # max (row 1) and min (row 0) only
    for r, uid in zip(a.batch["row"].tolist(), a.non_tensor_batch["uid"]):
        assert uid == "abcd"[r]


# ---------------------------------------------------------------------------------------------- DAPO overlong
def test_overlong_penalty_hand_computed():
    # max 10, buffer 4 → expected length 6: 5,6 → 0;  8 → −2/4 = −.5;  10 → −1;  12 → −1.5
    out = compute_overlong_penalty(T([5, 6, 8, 10, 12]), max_resp_len=10, overlong_buffer_len=4, penalty_factor=1.0)
    assert torch.allclose(out, T([0.0, 0.0, -0.5, -1.0, -1.5]))
    assert compute_overlong_penalty(T([8]), 10, 4, 2.0).item() == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="len"):
        compute_overlong_penalty(T([8]), 10, 0)


# ---------------------------------------------------------------------------------------------- rollout correction
OLD = T([[0.0, 0.0, 0.0, 0.0]])
ROLLOUT = T([[0.0, -math.log(3.0), math.log(2.0), 5.0]])  # w = π/μ = [1, 3, .5, (masked)]
MASK = T([[1.0, 1.0, 1.0, 0.0]])


def test_truncated_is_token_and_sequence():
    w, mask, m = compute_rollout_correction_weights(OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0)
    assert torch.allclose(w, T([[1.0, 2.0, 0.5, 0.0]]), atol=1e-6)  # 3 truncated to 2
    assert torch.equal(mask, MASK)
    assert m["rollout_corr/rollout_is_fraction_truncated"] == pytest.approx(1 / 3)
    # sequence: Π w = 1·3·.5 = 1.5 on every valid token
    w, _, _ = compute_rollout_correction_weights(OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_threshold=2.0)
    assert torch.allclose(w, T([[1.5, 1.5, 1.5, 0.0]]), atol=1e-6)


def test_rejection_and_veto():
    # token RS in [.5, 2]: w = 3 rejected, .5 kept (inclusive)
    w, mask, m = compute_rollout_correction_weights(
        OLD, ROLLOUT, MASK, rollout_is=None, rollout_rs="token", rollout_rs_threshold=2.0
    )
    assert w is None and torch.equal(mask, T([[1.0, 0.0, 1.0, 0.0]]))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    # geometric: exp(ln 1.5 / 3) ≈ 1.145 inside [.5, 2] → nothing rejected
    _, mask, _ = compute_rollout_correction_weights(OLD, ROLLOUT, MASK, rollout_is=None, rollout_rs="geometric", rollout_rs_threshold=2.0)
    assert torch.equal(mask, MASK)
    # veto .6: token with w = .5 vetoes the whole sequence; IS weights follow the new mask
    w, mask, m = compute_rollout_correction_weights(OLD, ROLLOUT, MASK, rollout_token_veto_threshold=0.6)
    assert torch.equal(mask, torch.zeros_like(MASK)) and torch.equal(w, torch.zeros_like(MASK))
    assert m["rollout_corr/rollout_veto_fraction"] == 1.0


def test_offpolicy_metrics_and_errors():
    _, _, m = compute_rollout_correction_weights(OLD, ROLLOUT, MASK)
    # k1 KL(μ‖π) = mean(log μ − log π) over valid tokens = (0 − ln 3 + ln 2)/3
    assert m["rollout_corr/kl"] == pytest.approx((math.log(2) - math.log(3)) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="rollout_is"):
        compute_rollout_correction_weights(OLD, ROLLOUT, MASK, rollout_is="geometric")
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        compute_rollout_correction_weights(OLD, ROLLOUT, MASK, rollout_rs="token")
