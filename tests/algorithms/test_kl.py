"""KL estimators (values and straight-through gradients) and KL controllers."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from hybridflow.algorithms import (
    AdaptiveKLController,
    FixedKLController,
    KL_PENALTY_NAMES,
    get_kl_controller,
    kl_penalty,
)

T = torch.tensor

# Δ = logp − ref:  Δ = .5 for the first token, Δ = −1 for the second
LOGP = [-1.0, -2.0]
REF = [-1.5, -1.0]
K3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1 - 1]  # e^{−Δ} + Δ − 1


@pytest.mark.parametrize(
    "name, expected",
    [
        ("kl", [0.5, -1.0]),
        ("k1", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),  # ½Δ²
        ("k2", [0.125, 0.5]),
        ("low_var_kl", K3),
        ("k3", K3),
    ],
)
def test_estimator_values(name, expected):
    assert torch.allclose(kl_penalty(T(LOGP), T(REF), name), T(expected), atol=1e-6)


@pytest.mark.parametrize(
    "name, grad",
    [
        ("k1", [1.0, 1.0]),  # dΔ/dlogp
        ("abs", [1.0, -1.0]),  # sign(Δ)
        ("k2", [0.5, -1.0]),  # Δ
        ("k3", [1 - math.exp(-0.5), 1 - math.exp(1.0)]),  # 1 − e^{−Δ}
    ],
)
def test_estimator_gradients(name, grad):
    logp = T(LOGP, requires_grad=True)
    kl_penalty(logp, T(REF), name).sum().backward()
    assert torch.allclose(logp.grad, T(grad), atol=1e-6)


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_value_of_base_gradient_of_k2(base):
    logp = T(LOGP, requires_grad=True)
    value = kl_penalty(logp, T(REF), base + "+")
    assert torch.allclose(value, kl_penalty(T(LOGP), T(REF), base), atol=1e-6)
    value.sum().backward()
    assert torch.allclose(logp.grad, T([0.5, -1.0]), atol=1e-6)  # ∂(½Δ²)/∂logp = Δ
    ref = T(REF, requires_grad=True)
    kl_penalty(T(LOGP), ref, base + "+").sum().backward()
    assert torch.allclose(ref.grad, T([-0.5, 1.0]), atol=1e-6)


def test_low_var_kl_is_clamped():
    # Δ = −30 → log ρ = 30 clamped to 20 → e^20 − 21, clamped to 10;  Δ = +30 → e^−20 + 20 − 1 ≈ 19 → 10
    out = kl_penalty(T([-30.0, 30.0]), T([0.0, 0.0]), "low_var_kl")
    assert torch.equal(out, T([10.0, 10.0]))


def test_full_kl_from_distributions():
    # p = [.5, .5], q = [.25, .75]: KL = .5 ln 2 + .5 ln(2/3)
    logp = torch.log(T([[[0.5, 0.5]]]))
    ref = torch.log(T([[[0.25, 0.75]]]))
    out = kl_penalty(logp, ref, "full")
    assert out.shape == (1, 1)
    assert out.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-6)


def test_full_kl_rejects_per_token_inputs():
    with pytest.raises(ValueError, match=r"\(B, R, V\)"):
        kl_penalty(T([[-1.0]]), T([[-1.0]]), "full")


def test_unknown_estimator():
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(T([0.0]), T([0.0]), "k4")
    assert "full" in KL_PENALTY_NAMES and "k3+" in KL_PENALTY_NAMES


def test_adaptive_controller_updates_hand_computed():
    # target .1, horizon 100: KL .15 → e = clip(.5, ±.2) = .2 → β = .2·(1 + .2·10/100) = .204
    #                         KL .09 → e = −.1 → β = .204·(1 − .1·10/100) = .20196
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(current_kl=0.15, n_steps=10)
    assert ctrl.value == pytest.approx(0.204)
    ctrl.update(current_kl=0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.20196)


def test_controller_state_round_trip():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    ctrl.update(0.5, 7)
    resumed = AdaptiveKLController(init_kl_coef=0.001, target_kl=0.1, horizon=100)
    resumed.load_state_dict(ctrl.state_dict())
    for kl in (0.3, 0.01):
        ctrl.update(kl, 4)
        resumed.update(kl, 4)
        assert resumed.value == ctrl.value
    fixed = FixedKLController(0.05)
    fixed.update(10.0, 100)
    other = FixedKLController(1.0)
    other.load_state_dict(fixed.state_dict())
    assert other.value == 0.05
    with pytest.raises(ValueError, match="type"):
        other.load_state_dict(ctrl.state_dict())


def test_get_kl_controller():
    fixed = get_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.001, horizon=10000, target_kl=0.1))
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.001
    adaptive = get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.001, horizon=10000, target_kl=0.1))
    assert isinstance(adaptive, AdaptiveKLController)
    with pytest.raises(ValueError, match="fixed, adaptive"):
        get_kl_controller(SimpleNamespace(type="pid", kl_coef=0.1, horizon=1, target_kl=0.1))
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.1, horizon=0, target_kl=0.1))
