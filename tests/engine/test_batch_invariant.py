"""Batch-invariant kernels (engine/batch_invariant.py): a row's bits do not depend on the rows computed with it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hybridflow.engine.batch_invariant import (
    batch_invariance_problem,
    invariant_attention,
    invariant_rms_norm,
    invariant_silu,
    is_batch_invariant,
    mark_batch_invariant,
)

HERE = Path(__file__).parent
REPO = HERE.parents[1]


def _probe(strict: bool) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HYBRIDFLOW_STRICT_MATMUL": "1" if strict else "0",
           "MKL_CBWR": "AUTO,STRICT" if strict else "AUTO"}
    out = subprocess.run([sys.executable, str(HERE / "strict_matmul_probe.py")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_strict_mode_makes_every_row_of_a_product_independent_of_the_row_count():
    on, off = _probe(True), _probe(False)
    assert on == {"strict": True, "mismatched_row_counts": []}
    assert not off["strict"] and off["mismatched_row_counts"]  # why it is needed: small products differ


def _rows_equal(fn, x: torch.Tensor) -> bool:
    full = fn(x)
    return all(torch.equal(fn(x[i:i + w].clone()), full[i:i + w]) for i in range(0, x.shape[0], 7) for w in (1, 3, 5))


def test_norm_and_silu_give_a_row_the_same_bits_wherever_it_lands():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1001, 37, generator=g) * 3
    weight = torch.randn(37, generator=g)
    assert _rows_equal(invariant_silu, x)
    assert _rows_equal(lambda t: invariant_rms_norm(t, weight, 1e-6), x)
    assert torch.allclose(invariant_silu(x), F.silu(x), atol=1e-6)
    ref = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.allclose(invariant_rms_norm(x, weight, 1e-6), ref, atol=1e-5)


def _qkv(B=3, H=4, Hkv=2, L=24, D=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g),
            torch.randn(B, Hkv, L, D, generator=g))


@pytest.mark.parametrize("L", [10, 24, 37])
def test_a_decode_step_against_a_cache_equals_the_full_causal_pass(L):
    q, k, v = _qkv(L=L)
    full = invariant_attention(q, k, v, None, 0.17)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True,
                                         scale=0.17)
    assert torch.allclose(full, ref, atol=1e-5)
    for capacity in (L, 64):
        for t in range(L):
            kc, vc = torch.zeros(3, 2, capacity, 32), torch.zeros(3, 2, capacity, 32)
            kc[:, :, :t + 1], vc[:, :, :t + 1] = k[:, :, :t + 1], v[:, :, :t + 1]
            n = t + 1 + (capacity - t - 1) // 2  # the decode reads a prefix of the cache
            allowed = (torch.arange(n) <= t)[None, None, None, :].expand(3, 1, 1, n)
            step = invariant_attention(q[:, :, t:t + 1], kc[:, :, :n], vc[:, :, :n], allowed, 0.17)
            assert torch.equal(step[:, :, 0], full[:, :, t]), (capacity, t)


def test_left_padding_changes_nothing():
    q, k, v = _qkv(B=1, L=20)
    full = invariant_attention(q, k, v, None, 0.2)
    pad = 7
    qp, kp, vp = (F.pad(t, (0, 0, pad, 0)) for t in (q, k, v))
    cols = torch.arange(20 + pad)
    allowed = (cols[None, :] <= cols[:, None]) & (cols[None, :] >= pad)
    out = invariant_attention(qp, kp, vp, allowed[None, None], 0.2)
    assert torch.equal(out[:, :, pad:], full)
    assert torch.equal(out[:, :, :pad], torch.zeros_like(out[:, :, :pad]))  # queries that see nothing


def test_the_attention_has_gradients():
    q, k, v = (t.requires_grad_() for t in _qkv(L=12))
    invariant_attention(q, k, v, None, 0.3).square().sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_marking_switches_the_model_and_its_attention(tiny_model_dir):
    from hybridflow.engine.forward import response_token_outputs
    from hybridflow.engine.model_loader import load_causal_lm

    model = load_causal_lm(tiny_model_dir).eval()
    assert batch_invariance_problem(model) is None
    ids = torch.randint(5, 40, (3, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(12).expand(3, 12),
             "responses": ids[:, -4:]}
    with torch.no_grad():
        before = response_token_outputs(model, batch, 0.8)["log_probs"]
        mark_batch_invariant(model)
        after = response_token_outputs(model, batch, 0.8)["log_probs"]
    assert is_batch_invariant(model) and is_batch_invariant(model.model.layers[0].self_attn)
    assert torch.allclose(before, after, atol=1e-5)
    model.config.hidden_act = "gelu"
    assert "gelu" in batch_invariance_problem(model)
