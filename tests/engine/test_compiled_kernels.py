"""``use_torch_compile``: the compiled log-prob/entropy kernels give the eager numbers, and are used only where the
vocabulary makes compiling pay (``engine/compiled_kernels.py``)."""

import pytest
import torch

from hybridflow.engine.compiled_kernels import COMPILE_MIN_VOCAB, wants_compiled
from hybridflow.engine.forward import logprob_entropy


def test_only_large_vocabularies_compile():
    assert not wants_compiled(True, 100) and not wants_compiled(False, 151936)
    assert wants_compiled(True, COMPILE_MIN_VOCAB) and wants_compiled(True, 151936)


@pytest.mark.slow
def test_compiled_kernels_match_eager_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, COMPILE_MIN_VOCAB, generator=g)
    labels = torch.randint(0, COMPILE_MIN_VOCAB, (40,), generator=g)
    outs = {}
    for flag in (False, True):
        x = logits.clone().requires_grad_()
        lp, ent = logprob_entropy(x, labels, True, chunk=16, use_torch_compile=flag)  # 3 chunks, one shorter
        (lp.sum() + 0.5 * ent.sum()).backward()
        outs[flag] = (lp.detach(), ent.detach(), x.grad)
    for a, b in zip(outs[False], outs[True]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_the_actor_passes_its_flag(tiny_model_dir, monkeypatch):
    """actor.use_torch_compile reaches the kernel choice (a recording stand-in for the decision function)."""
    import hybridflow.engine.compiled_kernels as ck
    from hybridflow.engine.forward import response_log_probs
    from hybridflow.engine.model_loader import load_causal_lm

    seen = []
    monkeypatch.setattr(ck, "wants_compiled", lambda flag, vocab: seen.append(flag) or False)
    model = load_causal_lm(tiny_model_dir)
    ids = torch.randint(5, 20, (2, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(6).expand(2, 6),
             "responses": ids[:, -2:]}
    response_log_probs(model, batch, 1.0, use_torch_compile=True)
    response_log_probs(model, batch, 1.0, use_torch_compile=False)
    assert seen == [True, False]
