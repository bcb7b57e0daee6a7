"""Online preference losses: DPO over self-play pairs (SPIN) and the pair labelling that feeds it.

SPIN (Chen et al. 2024, arXiv:2401.01335, eq. 4.7 with the logistic loss) trains the policy to prefer a target
response over its own previous iterate's sample; with the logistic loss its objective is the DPO loss (Rafailov
et al. 2023, arXiv:2305.18290, eq. 7) against a reference model that is the previous iterate.  For a pair
(chosen c, rejected r) with sequence log-probs ``L = Σ_t log π(y_t | x, y_<t)`` under the policy (π) and the
reference (ref)::

    z = (L_π(c) − L_π(r)) − (L_ref(c) − L_ref(r))
    sigmoid: loss = −(1 − ε)·log σ(β z) − ε·log σ(−β z)         (ε: label smoothing, cDPO)
    ipo:     loss = (z − 1/(2β))²                               (Azar et al. 2023, arXiv:2310.12036, eq. 17)

The gradient of the sigmoid loss is −β·σ(−β z)·(∇L_π(c) − ∇L_π(r)) for ε = 0: the pair weight σ(−β z) is 1/2 when
the policy equals its reference and vanishes as the margin grows, which is why SPIN refreshes the reference.

Pairs are two adjacent rows of a batch (row 2k and 2k+1); which one is chosen is a boolean per row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .masked import masked_sum

__all__ = ["DPO_LOSS_TYPES", "sequence_log_probs", "compute_online_dpo_loss", "compute_onlinedpo_pref",
           "pair_rows"]

DPO_LOSS_TYPES = ("sigmoid", "ipo")


def sequence_log_probs(log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) token log-probs -> (B,) response log-likelihoods Σ_t log π over the mask."""
    return masked_sum(log_prob, response_mask, axis=-1)


def compute_online_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
    reference_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses (P,) and the pair logits z (P,) (see the module docstring).

    ``reference_free`` drops the reference terms (z = L_π(c) − L_π(r)).  Reductions over pairs are the caller's:
    the actor divides by the number of pairs of the whole mini-batch so the update does not depend on how the
    pairs were split into micro-batches.
    """
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0 (actor_rollout_ref.actor.dpo_beta), got {beta}")
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss type {loss_type!r} (algorithm.dpo_loss_type); choose one of "
                         f"{', '.join(DPO_LOSS_TYPES)}")
    logits = policy_chosen_logps - policy_rejected_logps
    if not reference_free:
        logits = logits - (reference_chosen_logps - reference_rejected_logps)
    if loss_type == "sigmoid":
        losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(-beta * logits)
    else:
        losses = (logits - 1.0 / (2.0 * beta)) ** 2
    return losses, logits


def compute_onlinedpo_pref(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Which row of each adjacent pair is chosen: the one with the higher summed reward, the first on a tie.

    Rows are interleaved ``[a_0, b_0, a_1, b_1, ...]`` (the two samples of a prompt side by side, as the rollout
    returns ``n = 2``).  Returns a (B,) bool mask, exactly one True per pair.
    """
    if token_level_rewards.shape != response_mask.shape:
        raise ValueError(f"rewards {tuple(token_level_rewards.shape)} and mask {tuple(response_mask.shape)} differ")
    if token_level_rewards.shape[0] % 2:
        raise ValueError(f"online DPO pairs two samples per prompt, but the batch has {token_level_rewards.shape[0]} "
                         "rows (odd); set actor_rollout_ref.rollout.n=2")
    scores = masked_sum(token_level_rewards, response_mask, axis=-1).view(-1, 2)
    second_wins = scores[:, 1] > scores[:, 0]
    chosen = torch.stack([~second_wins, second_wins], dim=1)
    return chosen.reshape(-1)


def pair_rows(seq_values: torch.Tensor, chosen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (B,) per-row values of adjacent pairs into (chosen (P,), rejected (P,)) by the (B,) ``chosen`` mask."""
    if seq_values.shape[0] % 2:
        raise ValueError(f"pairs need an even number of rows, got {seq_values.shape[0]}")
    values = seq_values.view(-1, 2)
    first = chosen.view(-1, 2)[:, 0]
    chosen_values = torch.where(first, values[:, 0], values[:, 1])
    rejected_values = torch.where(first, values[:, 1], values[:, 0])
    return chosen_values, rejected_values
