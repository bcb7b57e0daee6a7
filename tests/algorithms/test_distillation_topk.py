"""verl's forward_kl_topk distillation: the loss against a hand computation, and the engine's top-k passes against
the full distribution of the model (teacher's top-k ids / log-probs; the student's log-probs at given ids, with
gradients that reach every logit of the position)."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algorithms.distillation import DistillationSettings, compute_distillation_loss, forward_kl_topk_losses

T = torch.tensor


def test_forward_kl_over_the_teachers_top_k_hand_computed():
    teacher = torch.log(T([[[0.5, 0.3], [0.9, 0.05]]]))  # (1, 2, k=2)
    student = torch.log(T([[[0.25, 0.25], [0.9, 0.05]]]))
    settings = DistillationSettings(loss_mode="forward_kl_topk", topk=2, use_task_rewards=False)
    losses = forward_kl_topk_losses(student, teacher, settings)
    assert losses[0, 0].item() == pytest.approx(0.5 * math.log(2) + 0.3 * math.log(0.3 / 0.25), abs=1e-6)
    assert losses[0, 1].item() == pytest.approx(0.0, abs=1e-6)  # same distribution there
    mask = T([[1.0, 1.0]])
    term, metrics = compute_distillation_loss(student[..., 0], student[..., 0], teacher[..., 0], mask, "token-mean",
                                              None, settings, topk=(student, teacher))
    assert term.item() == pytest.approx(losses.mean().item(), abs=1e-6)
    assert metrics["distillation/teacher_mass"].item() == pytest.approx((0.8 + 0.95) / 2, abs=1e-6)
    assert metrics["distillation/student_mass"].item() == pytest.approx((0.5 + 0.95) / 2, abs=1e-6)
    clamped = DistillationSettings(loss_mode="forward_kl_topk", topk=2, loss_max_clamp=0.1)
    assert forward_kl_topk_losses(student, teacher, clamped)[0, 0].item() == pytest.approx(0.1)
    with pytest.raises(ValueError, match="use_policy_gradient=false and topk >= 1"):
        DistillationSettings(loss_mode="forward_kl_topk", use_policy_gradient=True)


@pytest.mark.parametrize("use_remove_padding", [False, True])
def test_engine_top_k_passes_equal_the_full_distribution(use_remove_padding):
    from hybridflow.engine.topk_outputs import response_outputs_at, response_topk
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    model = build_tiny_model(build_char_tokenizer(), size="nano", family="qwen3", seed=0)
    g = torch.Generator().manual_seed(0)
    prompts, responses = torch.randint(3, 40, (2, 5), generator=g), torch.randint(3, 40, (2, 4), generator=g)
    ids = torch.cat([prompts, responses], dim=1)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded prompt
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": responses}
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=pos).logits / 0.7, -1)[:, 4:8]
    top = response_topk(model, batch, 3, temperature=0.7, use_remove_padding=use_remove_padding)
    want = full.topk(3, dim=-1)
    assert torch.equal(top["topk_ids"], want.indices)
    assert torch.allclose(top["topk_log_probs"], want.values, atol=1e-5)
    at = torch.randint(0, full.shape[-1], (2, 4, 3), generator=g)
    out = response_outputs_at(model, batch, at, temperature=0.7, calculate_entropy=True,
                              use_remove_padding=use_remove_padding)
    assert torch.allclose(out["log_probs_at"], full.gather(-1, at), atol=1e-5)
    assert torch.allclose(out["log_probs"], full.gather(-1, responses.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    out["log_probs_at"].sum().backward()
    assert model.lm_head.weight.grad.abs().sum() > 0  # the gradient reaches the whole distribution
