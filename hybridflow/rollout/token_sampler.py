"""Vectorised next-token sampling for a decode batch whose rows may use different parameters.

One call handles the whole batch with a handful of tensor ops -- no per-row Python and none of
HF ``generate``'s logits-processor / stopping-criteria machinery.  Sampling uses the Gumbel-max trick
(Gumbel 1954; Maddison, Tarlow & Minka 2014, "A* Sampling"): ``argmax(x + G)`` with
``G = -log(E)``, ``E ~ Exp(1)``, is an exact draw from ``softmax(x)``, so no softmax/cumsum/multinomial
is needed on the common path (no top-k / top-p).

The log-prob reported for each token is ``log softmax(logits / T)[token]`` over the *unfiltered*
distribution: exactly what the actor recomputes for ``old_log_probs`` (verl scales logits by the rollout
temperature and applies no top-k/top-p), so train/rollout log-prob mismatch metrics compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["RowSampling", "sample_next_tokens"]


@dataclass
class RowSampling:
    """Per-row sampling parameters of a decode batch as tensors (one entry per row)."""

    inv_temperature: torch.Tensor  # (B,) float, 1 for greedy rows
    greedy: torch.Tensor  # (B,) bool
    top_k: torch.Tensor  # (B,) long, vocab size where top-k is off
    top_p: torch.Tensor  # (B,) float
    any_sample: bool
    any_greedy: bool
    any_top_k: bool
    any_top_p: bool

    @classmethod
    def build(cls, params: Sequence[SamplingParams], vocab_size: int, device) -> "RowSampling":
        temps = [p.logprob_temperature for p in params]
        greedy = [p.greedy for p in params]
        top_k = [p.top_k if p.top_k > 0 and not p.greedy else vocab_size for p in params]
        top_p = [1.0 if p.greedy else p.top_p for p in params]
        return cls(
            inv_temperature=torch.tensor([1.0 / t for t in temps], dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            any_sample=not all(greedy),
            any_greedy=any(greedy),
            any_top_k=any(k < vocab_size for k in top_k),
            any_top_p=any(p < 1.0 for p in top_p),
        )

    def select(self, idx: torch.Tensor) -> "RowSampling":
        """Rows ``idx`` (used when finished rows leave the batch); flags stay conservative."""
        return RowSampling(
            self.inv_temperature[idx], self.greedy[idx], self.top_k[idx], self.top_p[idx],
            self.any_sample, self.any_greedy, self.any_top_k, self.any_top_p,
        )

    @staticmethod
    def cat(parts: Sequence["RowSampling"]) -> "RowSampling":
        return RowSampling(
            torch.cat([p.inv_temperature for p in parts]),
            torch.cat([p.greedy for p in parts]),
            torch.cat([p.top_k for p in parts]),
            torch.cat([p.top_p for p in parts]),
            any(p.any_sample for p in parts),
            any(p.any_greedy for p in parts),
            any(p.any_top_k for p in parts),
            any(p.any_top_p for p in parts),
        )


def _filter_top_k_top_p(scaled: torch.Tensor, rows: RowSampling) -> torch.Tensor:
    """Set logits outside each row's top-k set, then outside its top-p nucleus, to -inf.

    Same order as HF/vLLM: top-k first, then top-p on the renormalised top-k distribution.  A row
    always keeps its most likely token.
    """
    sorted_logits, sorted_idx = scaled.sort(dim=-1, descending=True)
    vocab = scaled.shape[-1]
    if rows.any_top_k:
        ranks = torch.arange(vocab, device=scaled.device)
        sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= rows.top_k[:, None], float("-inf"))
    if rows.any_top_p:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= rows.top_p[:, None], float("-inf"))
    return torch.empty_like(scaled).scatter_(1, sorted_idx, sorted_logits)


def sample_next_tokens(
    logits: torch.Tensor, rows: RowSampling, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from ``logits`` (B, V); return ``(tokens (B,), log_probs (B,))``.

    Greedy rows take the arg-max; sampling rows draw from ``softmax(logits / T)`` restricted to their
    top-k / top-p set.  ``generator`` makes draws reproducible for a fixed batch composition.
    """
    scaled = logits.float() * rows.inv_temperature[:, None]
    if rows.any_sample:
        candidates = _filter_top_k_top_p(scaled, rows) if (rows.any_top_k or rows.any_top_p) else scaled
        noise = torch.empty_like(candidates).exponential_(generator=generator)
        tokens = (candidates - noise.log_()).argmax(dim=-1)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    else:
        tokens = scaled.argmax(dim=-1)
    log_probs = scaled.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return tokens, log_probs
