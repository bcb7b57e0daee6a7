"""The rollout-correction stage writes the batch keys the actor reads, with hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.rollout_correction_stage import apply_rollout_correction, correction_enabled


def _rc(**kw):
    base = dict(rollout_is=None, rollout_is_threshold=2.0, rollout_rs=None, rollout_rs_threshold=None,
                rollout_is_batch_normalize=False, bypass_mode=False, loss_type="ppo_clip")
    base.update(kw)
    return SimpleNamespace(**base)


def _batch():
    # token ratios pi_old / mu: [1.0, 2.0, 0.5, (padding)]
    old = torch.log(torch.tensor([[0.4, 0.5, 0.2, 0.9]]))
    mu = torch.log(torch.tensor([[0.4, 0.25, 0.4, 0.1]]))
    mask = torch.tensor([[1, 1, 1, 0]])
    return DataProto.from_dict(tensors={"old_log_probs": old, "rollout_log_probs": mu, "response_mask": mask})


def test_token_is_weights_are_truncated_ratios():
    batch = _batch()
    metrics = apply_rollout_correction(batch, _rc(rollout_is="token", rollout_is_threshold=1.5))
    assert torch.allclose(batch.batch["rollout_is_weights"], torch.tensor([[1.0, 1.5, 0.5, 0.0]]), atol=1e-6)
    assert batch.batch["response_mask"].tolist() == [[1, 1, 1, 0]]  # IS alone rejects nothing
    assert metrics["rollout_corr/rollout_is_fraction_truncated"] == pytest.approx(1 / 3)
    # k1 KL(mu||pi) over valid tokens: mean(log mu - log pi) = (0 + log .5 + log 2) / 3 = 0
    assert metrics["rollout_corr/kl"] == pytest.approx(0.0, abs=1e-6)


def test_sequence_is_weight_is_the_product_and_rejection_narrows_the_mask():
    batch = _batch()
    apply_rollout_correction(batch, _rc(rollout_is="sequence", rollout_is_threshold=5.0))
    # product of ratios 1 * 2 * 0.5 = 1 on every valid token
    assert torch.allclose(batch.batch["rollout_is_weights"], torch.tensor([[1.0, 1.0, 1.0, 0.0]]), atol=1e-6)

    batch = _batch()
    metrics = apply_rollout_correction(batch, _rc(rollout_rs="token", rollout_rs_threshold=1.5))
    # band [1/1.5, 1.5]: ratio 1.0 kept, 2.0 and 0.5 rejected
    assert batch.batch["response_mask"].tolist() == [[1, 0, 0, 0]]
    assert "rollout_is_weights" not in batch.batch
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 3)


def test_disabled_is_a_no_op_and_missing_rollout_log_probs_names_the_fix():
    batch = _batch()
    assert not correction_enabled(_rc())
    assert apply_rollout_correction(batch, _rc()) == {}
    assert "rollout_is_weights" not in batch.batch
    no_mu = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(1, 2), "response_mask": torch.ones(1, 2)})
    with pytest.raises(ValueError, match="calculate_log_probs=true"):
        apply_rollout_correction(no_mu, _rc(rollout_is="token"))
