"""Per-token KL estimators between the policy and the reference policy.

Samples come from π_θ, Δ = log π_θ(y_t) − log π_ref(y_t), ρ = π_ref/π_θ = e^{−Δ}
(J. Schulman, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html):

* ``kl`` / ``k1``          Δ                  unbiased, high variance, can be negative
* ``abs``                  |Δ|
* ``mse`` / ``k2``         ½Δ²                biased, low variance; its gradient is the KL gradient
* ``low_var_kl`` / ``k3``  ρ − 1 − log ρ = e^{−Δ} + Δ − 1   unbiased and ≥ 0; as in verl −Δ is clamped
                           to [−20, 20] and the result to [−10, 10] so one outlier token cannot blow up
* ``<name>+``              straight-through: the *value* of ``<name>`` with the *gradient* of k2,
                           i.e. value + (k2 − sg(k2)); used as a loss, k1/k3 values give a biased
                           gradient while k2's gradient is the unbiased KL gradient
* ``full``                 exact KL(π_θ‖π_ref) = Σ_v π_θ(v)(log π_θ(v) − log π_ref(v)) from full
                           ``(B, R, V)`` log-distributions (verl lists it but never implemented it)
"""

from __future__ import annotations

import torch

__all__ = ["KL_PENALTY_NAMES", "kl_penalty", "kl_penalty_forward", "full_kl"]

_BASE_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_NAMES = _BASE_ESTIMATORS + tuple(f"{n}+" for n in _BASE_ESTIMATORS) + ("full",)


def full_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """Exact KL(π‖π_ref) per position from full log-distributions of shape ``(..., V)``."""
    if logprob.dim() < 3 or logprob.shape != ref_logprob.shape:
        raise ValueError(
            "kl_penalty='full' needs the full log-distributions over the vocabulary, shape (B, R, V), for both "
            f"the policy and the reference; got {tuple(logprob.shape)} and {tuple(ref_logprob.shape)}. "
            "Per-token log-probs only support the sampled estimators kl/k1, abs, mse/k2, low_var_kl/k3."
        )
    return (logprob.exp() * (logprob - ref_logprob)).sum(dim=-1)


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """The value of one of the base estimators (no straight-through handling)."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        log_rho = (ref_logprob - logprob).clamp(min=-20.0, max=20.0)
        return (log_rho.exp() - log_rho - 1.0).clamp(min=-10.0, max=10.0)
    if kl_penalty == "full":
        return full_kl(logprob, ref_logprob)
    raise ValueError(f"Unknown kl_penalty '{kl_penalty}'; choose one of {', '.join(KL_PENALTY_NAMES)}")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate named by ``kl_penalty`` (see the module docstring); same shape as the inputs
    (or ``(B, R)`` for ``full``)."""
    if kl_penalty not in KL_PENALTY_NAMES:
        raise ValueError(
            f"Unknown kl_penalty '{kl_penalty}' (algorithm.kl_penalty / actor.kl_loss_type); "
            f"choose one of {', '.join(KL_PENALTY_NAMES)}"
        )
    if not kl_penalty.endswith("+"):
        return kl_penalty_forward(logprob, ref_logprob, kl_penalty)
    value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
    k2 = 0.5 * (logprob - ref_logprob).square()
    return value.detach() + (k2 - k2.detach())
