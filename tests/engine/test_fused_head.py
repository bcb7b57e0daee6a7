"""The fused LM head (engine/fused_head.py) equals the materialised head, forward and backward, without the logits."""

import sys
from pathlib import Path

import pytest
import torch

from hybridflow.algorithms.entropy import entropy_from_logits, logprobs_from_logits
from hybridflow.algorithms.token_baseline import sum_pi_squared_from_logits
from hybridflow.engine.forward import response_token_outputs
from hybridflow.engine.fused_head import (
    chunk_rows_for,
    configure_fused_head,
    fused_head_problem,
    fused_token_outputs,
)

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from multirank import run_ranks  # noqa: E402


def _materialised(hidden, weight, labels, temperature):
    logits = (hidden @ weight.t()) / temperature
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits), sum_pi_squared_from_logits(logits)


@pytest.mark.parametrize("chunk", [7, 64, None])
def test_outputs_and_gradients_equal_the_materialised_head(chunk):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 19, 24, generator=g, requires_grad=True)
    weight = (torch.randn(1000, 24, generator=g) * 0.3).requires_grad_()
    labels = torch.randint(0, 1000, (2, 19), generator=g)
    a, b = torch.randn(2, 19, generator=g), torch.randn(2, 19, generator=g)
    out = fused_token_outputs(hidden, weight, labels, 0.7, calculate_entropy=True, sum_pi_squared=True,
                              chunk_rows=chunk)
    ((a * out["log_probs"]).sum() + (b * out["entropy"]).sum()).backward()
    fused_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    lp, ent, spq = _materialised(hidden, weight, labels, 0.7)
    ((a * lp).sum() + (b * ent).sum()).backward()
    assert torch.allclose(out["log_probs"], lp, atol=1e-5)
    assert torch.allclose(out["entropy"], ent, atol=1e-5)
    assert torch.allclose(out["sum_pi_squared"], spq.detach(), atol=1e-5)
    assert torch.allclose(fused_grads[0], hidden.grad, atol=1e-5)
    assert torch.allclose(fused_grads[1], weight.grad, atol=1e-5)
    assert not out["sum_pi_squared"].requires_grad


def test_entropy_as_a_metric_takes_no_gradient():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 8, generator=g, requires_grad=True)
    weight = torch.randn(50, 8, generator=g)
    labels = torch.randint(0, 50, (9,), generator=g)
    out = fused_token_outputs(hidden, weight, labels, 1.0, calculate_entropy=True, entropy_grad=False, chunk_rows=4)
    assert out["log_probs"].requires_grad and not out["entropy"].requires_grad
    out["log_probs"].sum().backward()
    h2 = hidden.detach().requires_grad_()
    logprobs_from_logits(h2 @ weight.t(), labels).sum().backward()
    assert torch.allclose(hidden.grad, h2.grad, atol=1e-5)


def test_chunk_rows_keep_a_chunk_of_logits_under_the_budget():
    assert chunk_rows_for(151_936) == 220
    assert chunk_rows_for(512) == 65_536
    assert chunk_rows_for(151_936, 64) == 64


def _outputs(model, data, temperature, packed):
    return response_token_outputs(model, data.batch, temperature, calculate_entropy=True, packed=packed,
                                  calculate_sum_pi_squared=True)


@pytest.mark.parametrize("packed", [True, False])
def test_model_head_runs_fused_and_equals_the_materialised_head(tiny_causal_lm, batches, packed):
    model = tiny_causal_lm
    data = batches.make_rollout_batch(model.config.vocab_size, batch_size=4, prompt_len=6, response_len=5, seed=3)
    mask = data.batch["response_mask"].bool()
    calls = []
    hook = model.lm_head.register_forward_hook(lambda *a: calls.append(1))
    try:
        configure_fused_head(model, True, chunk_rows=5)
        fused = _outputs(model, data, 0.8, packed)
        (fused["log_probs"][mask].sum() + fused["entropy"][mask].sum()).backward()
        fused_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        assert not calls  # the logits were never computed
        model.zero_grad(set_to_none=True)
        configure_fused_head(model, False)
        plain = _outputs(model, data, 0.8, packed)
        (plain["log_probs"][mask].sum() + plain["entropy"][mask].sum()).backward()
        assert calls
    finally:
        hook.remove()
        configure_fused_head(model, False)
    for k in ("log_probs", "entropy", "sum_pi_squared"):
        assert torch.allclose(fused[k][mask], plain[k][mask], atol=1e-5), k
    for n, p in model.named_parameters():
        assert torch.allclose(fused_grads[n], p.grad, atol=1e-5), n
    model.zero_grad(set_to_none=True)
    assert model(input_ids=data.batch["input_ids"][:1]).logits.shape[-1] == model.config.vocab_size  # slot inactive


def test_a_head_with_scaled_logits_stays_materialised(tiny_causal_lm):
    assert fused_head_problem(tiny_causal_lm) is None
    tiny_causal_lm.config.final_logit_softcapping = 30.0
    try:
        assert "final_logit_softcapping" in fused_head_problem(tiny_causal_lm)
    finally:
        tiny_causal_lm.config.final_logit_softcapping = None


def test_negative_chunk_size_is_refused_naming_the_key(tiny_causal_lm):
    with pytest.raises(ValueError, match="fused_kernel_options.chunk_size"):
        configure_fused_head(tiny_causal_lm, True, chunk_rows=-1)


def test_vocab_parallel_fused_head_equals_one_rank(tmp_path):
    """Two gloo ranks, the head's weight split over the vocabulary: the same outputs and gradients as one rank."""
    logs = run_ranks(HERE / "fused_head_scenario.py", 2, [str(tmp_path)], tmp_path / "logs", timeout=300)
    assert all("OK" in log for log in logs), logs
