"""Vectorised next-token sampling for a decode batch whose rows may use different parameters.

One call handles the whole batch with a handful of tensor ops -- no per-row Python and none of
HF ``generate``'s logits-processor / stopping-criteria machinery.  Sampling uses the Gumbel-max trick
(Gumbel 1954; Maddison, Tarlow & Minka 2014, "A* Sampling"): ``argmax(x + G)`` with
``G = -log(E)``, ``E ~ Exp(1)``, is an exact draw from ``softmax(x)``, so no softmax/cumsum/multinomial
is needed on the common path (no top-k / top-p).

Requests with ``SamplingParams.seed`` are drawn by inverse-CDF sampling instead: one uniform per row from a
counter-based hash of ``(seed, t)`` (t = index of the token in the response; no generator state), so the
token a seeded request draws depends only on its seed, t and its own logits -- not on which requests share
the batch, their order or when they joined.  Top-k / top-p / temperature apply exactly as on the Gumbel path.

The log-prob reported for each token is ``log softmax(logits / T)[token]`` over the *unfiltered*
distribution: exactly what the actor recomputes for ``old_log_probs`` (verl scales logits by the rollout
temperature and applies no top-k/top-p), so train/rollout log-prob mismatch metrics compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["RowSampling", "inverse_cdf_sample", "sample_next_tokens", "seeded_uniform", "split_seed"]

_M32 = 0xFFFFFFFF
_U53 = float(2**53)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 tensors holding values < 2**32, without int64 overflow."""
    lo = x * (c & 0xFFFF)  # < 2**48
    hi = (x * (c >> 16)) & 0xFFFF  # the product's bits that survive the shift by 16
    return (lo + (hi << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (the "lowbias32" constants of Wellons' hash-prospector): every
    input bit flips each output bit with probability close to 1/2."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def split_seed(seed: int) -> tuple[int, int]:
    """A Python int seed (any sign or size) as two 32-bit halves of its value mod 2**64."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s & _M32, s >> 32


def seeded_uniform(seed_lo: torch.Tensor, seed_hi: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in [0, 1) per row, a pure function of ``(seed, step)`` (53 random bits).

    Counter-based (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"): nothing is
    carried between draws, so a row's draw cannot depend on other rows or on earlier calls.
    """
    t = step.to(torch.int64) & _M32
    a = _mix32(seed_lo ^ _mix32(seed_hi ^ _mix32(t ^ 0x9E3779B9)))
    b = _mix32(a ^ _mix32(t ^ 0x85EBCA6B) ^ 0x27D4EB2F)
    return ((a << 21) + (b >> 11)).to(torch.float64) / _U53


@dataclass
class RowSampling:
    """Per-row sampling parameters of a decode batch as tensors (one entry per row)."""

    inv_temperature: torch.Tensor  # (B,) float, 1 for greedy rows
    greedy: torch.Tensor  # (B,) bool
    top_k: torch.Tensor  # (B,) long, vocab size where top-k is off
    top_p: torch.Tensor  # (B,) float
    seed_lo: torch.Tensor  # (B,) int64, low 32 bits of the request seed (0 when unseeded)
    seed_hi: torch.Tensor  # (B,) int64, high 32 bits
    seeded: torch.Tensor  # (B,) bool: a sampling row with its own seed (inverse-CDF path)
    any_sample: bool
    any_greedy: bool
    any_top_k: bool
    any_top_p: bool
    seeded_rows: torch.Tensor | None = None  # indices of the seeded rows; None when there are none
    all_seeded: bool = False

    def __post_init__(self):
        self._index_seeded()

    def _index_seeded(self) -> None:
        n_seeded = int(self.seeded.sum()) if self.seeded.numel() else 0
        self.seeded_rows = self.seeded.nonzero().flatten() if n_seeded else None
        self.all_seeded = n_seeded == self.seeded.numel() and n_seeded > 0

    @classmethod
    def build(cls, params: Sequence[SamplingParams], vocab_size: int, device) -> "RowSampling":
        temps = [p.logprob_temperature for p in params]
        greedy = [p.greedy for p in params]
        top_k = [p.top_k if p.top_k > 0 and not p.greedy else vocab_size for p in params]
        top_p = [1.0 if p.greedy else p.top_p for p in params]
        seeds = [split_seed(p.seed) if p.seed is not None else (0, 0) for p in params]
        return cls(
            inv_temperature=torch.tensor([1.0 / t for t in temps], dtype=torch.float32, device=device),
            greedy=torch.tensor(greedy, dtype=torch.bool, device=device),
            top_k=torch.tensor(top_k, dtype=torch.long, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            seed_lo=torch.tensor([lo for lo, _ in seeds], dtype=torch.int64, device=device),
            seed_hi=torch.tensor([hi for _, hi in seeds], dtype=torch.int64, device=device),
            seeded=torch.tensor([p.seed is not None and not p.greedy for p in params], dtype=torch.bool,
                                device=device),
            any_sample=not all(greedy),
            any_greedy=any(greedy),
            any_top_k=any(k < vocab_size for k in top_k),
            any_top_p=any(p < 1.0 for p in top_p),
        )

    def _fields(self):
        return (self.inv_temperature, self.greedy, self.top_k, self.top_p, self.seed_lo, self.seed_hi, self.seeded)

    def select(self, idx: torch.Tensor) -> "RowSampling":
        """Rows ``idx`` (used when finished rows leave the batch); flags stay conservative."""
        return RowSampling(*(t[idx] for t in self._fields()),
                           self.any_sample, self.any_greedy, self.any_top_k, self.any_top_p)

    @staticmethod
    def cat(parts: Sequence["RowSampling"]) -> "RowSampling":
        fields = [torch.cat(ts) for ts in zip(*(p._fields() for p in parts))]
        return RowSampling(
            *fields,
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


def inverse_cdf_sample(candidates: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token whose CDF interval (in vocabulary order) holds ``uniforms`` (float64, one per row).

    ``candidates`` are the filtered, temperature-scaled logits (-inf outside the top-k/top-p set).  The
    CDF is taken in float64, so a token is chosen with probability softmax(candidates)[token] up to
    ~1e-16; tokens of probability 0 (filtered out) are never chosen.
    """
    probs = torch.softmax(candidates.double(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = uniforms * cdf[:, -1]
    tokens = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    # A target rounding onto the total would step past the end: take the last token that can be drawn.
    vocab = torch.arange(candidates.shape[-1], device=candidates.device)
    last = torch.where(probs > 0, vocab, 0).amax(dim=-1)
    return torch.minimum(tokens, last)


def sample_next_tokens(
    logits: torch.Tensor, rows: RowSampling, generator: torch.Generator | None, steps: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from ``logits`` (B, V); return ``(tokens (B,), log_probs (B,))``.

    Greedy rows take the arg-max; sampling rows draw from ``softmax(logits / T)`` restricted to their
    top-k / top-p set: unseeded rows through Gumbel noise from ``generator`` (reproducible for a fixed
    batch composition), seeded rows by inverse CDF at the uniform of ``(seed, steps[row])``, where
    ``steps`` (B,) is the index of the token being drawn in each row's response.
    """
    scaled = logits.float() * rows.inv_temperature[:, None]
    if rows.any_sample:
        candidates = _filter_top_k_top_p(scaled, rows) if (rows.any_top_k or rows.any_top_p) else scaled
        if rows.all_seeded:
            tokens = inverse_cdf_sample(candidates, seeded_uniform(rows.seed_lo, rows.seed_hi, steps))
        else:
            noise = torch.empty_like(candidates).exponential_(generator=generator)
            tokens = (candidates - noise.log_()).argmax(dim=-1)
            if rows.seeded_rows is not None:
                idx = rows.seeded_rows
                u = seeded_uniform(rows.seed_lo[idx], rows.seed_hi[idx], steps[idx])
                tokens[idx] = inverse_cdf_sample(candidates[idx], u)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    else:
        tokens = scaled.argmax(dim=-1)
    log_probs = scaled.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(scaled, dim=-1)
    return tokens, log_probs
