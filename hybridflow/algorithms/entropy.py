"""Token log-probabilities and entropies from logits, without materialising extra (N, V) tensors.

With vocabularies of 150k tokens a full ``log_softmax`` of a (B·R, V) logits tensor doubles the
largest activation of the step.  Here the log-prob of the label is ``logit[label] − logsumexp(logits)``
and the entropy is ``logsumexp(z) − Σ softmax(z)·z``; the chunked variants process ``chunk_size`` rows
at a time so the temporaries stay (chunk, V).  Half-precision logits are upcast per chunk to float32.
"""

from __future__ import annotations

import torch

from .aggregation import agg_loss

__all__ = [
    "logprobs_from_logits",
    "entropy_from_logits",
    "entropy_from_logits_with_chunking",
    "compute_entropy_loss",
]


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """log π(label) for logits ``(..., V)`` and integer labels ``(...)``; returns ``(...)``.

    Computed as ``logits.gather(label) − logsumexp(logits)`` over chunks of ``chunk_size`` rows.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logprobs_from_logits: logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1, 1).long()
    pieces = []
    for start in range(0, flat_logits.shape[0], chunk_size):
        chunk = _upcast(flat_logits[start : start + chunk_size])
        picked = chunk.gather(-1, flat_labels[start : start + chunk_size]).squeeze(-1)
        pieces.append(picked - torch.logsumexp(chunk, dim=-1))
    if not pieces:
        return torch.zeros(labels.shape, dtype=_upcast(logits).dtype, device=logits.device)
    return torch.cat(pieces).reshape(labels.shape)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy H = logsumexp(z) − Σ_v softmax(z)_v·z_v over the last dim."""
    z = _upcast(logits)
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """Same as :func:`entropy_from_logits`, ``chunk_size`` rows at a time (bounded temporaries)."""
    flat = logits.reshape(-1, logits.shape[-1])
    pieces = [entropy_from_logits(flat[s : s + chunk_size]) for s in range(0, flat.shape[0], chunk_size)]
    if not pieces:
        return torch.zeros(logits.shape[:-1], dtype=_upcast(logits).dtype, device=logits.device)
    return torch.cat(pieces).reshape(logits.shape[:-1])


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", **normalizers
) -> torch.Tensor:
    """Aggregated token entropy (the actor subtracts ``entropy_coeff`` times this from its loss)."""
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode, **normalizers)
