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

__all__ = ["RowSampling", "inverse_cdf_sample", "sample_next_tokens", "seed_key", "seeded_uniform", "split_seed"]

_M32 = 0xFFFFFFFF
_U32 = float(2**32)
# The "lowbias32" multipliers of Wellons' hash-prospector.  The second is >= 2**31; it is applied as its
# negative residue mod 2**32, so a product with a 32-bit value never leaves int64 (no overflow) and its
# low 32 bits are the same.
_C1, _C2 = 0x7FEB352D, 0x846CA68B
_C2_RESIDUE = _C2 - 2**32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser on int64 tensors holding values < 2**32: every input bit flips each
    output bit with probability close to 1/2."""
    x = x ^ (x >> 16)
    x = (x * _C1) & _M32
    x = x ^ (x >> 15)
    x = (x * _C2_RESIDUE) & _M32
    return x ^ (x >> 16)


def _mix32_int(x: int) -> int:
    """:func:`_mix32` on a Python int (the per-request part, computed once at admission)."""
    x ^= x >> 16
    x = (x * _C1) & _M32
    x ^= x >> 15
    x = (x * _C2) & _M32
    return x ^ (x >> 16)


def split_seed(seed: int) -> tuple[int, int]:
    """A Python int seed (any sign or size) as two 32-bit halves of its value mod 2**64."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s & _M32, s >> 32


def seed_key(seed: int) -> int:
    """The 32-bit key of a request seed (all 64 bits of it matter)."""
    lo, hi = split_seed(seed)
    return _mix32_int(lo ^ _mix32_int(hi ^ 0x9E3779B9))


def seeded_uniform(keys: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in [0, 1 - 2**-32] per row, a pure function of ``(seed key, step)``.

    Counter-based (Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"): nothing is
    carried between draws, so a row's draw cannot depend on other rows or on earlier calls.  32 bits of
    resolution, as many as a float32 uniform has mantissa and more than enough for a sampling threshold.
    """
    t = step.to(torch.int64) & _M32
    return _mix32(keys ^ _mix32(t ^ 0x85EBCA6B)).to(torch.float64) / _U32


@dataclass
class RowSampling:
    """Per-row sampling parameters of a decode batch as tensors (one entry per row)."""

    inv_temperature: torch.Tensor  # (B,) float, 1 for greedy rows
    greedy: torch.Tensor  # (B,) bool
    top_k: torch.Tensor  # (B,) long, vocab size where top-k is off
    top_p: torch.Tensor  # (B,) float
    seed_key: torch.Tensor  # (B,) int64, seed_key(request seed) (0 when unseeded)
    seeded: torch.Tensor  # (B,) bool: a sampling row with its own seed (inverse-CDF path)
    any_sample: bool
    any_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_seeded: bool = True  # False: no row is seeded (skips counting them)
    seeded_rows: torch.Tensor | None = None  # indices of the seeded rows; None when there are none
    all_seeded: bool = False

    def __post_init__(self):
        self._index_seeded()

    def _index_seeded(self) -> None:
        n_seeded = int(self.seeded.sum()) if self.any_seeded and self.seeded.numel() else 0
        self.seeded_rows = self.seeded.nonzero().flatten() if n_seeded else None
        self.all_seeded = n_seeded == self.seeded.numel() and n_seeded > 0

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
            seed_key=torch.tensor([seed_key(p.seed) if p.seed is not None else 0 for p in params], dtype=torch.int64,
                                  device=device),
            seeded=torch.tensor([p.seed is not None and not p.greedy for p in params], dtype=torch.bool,
                                device=device),
            any_sample=not all(greedy),
            any_greedy=any(greedy),
            any_top_k=any(k < vocab_size for k in top_k),
            any_top_p=any(p < 1.0 for p in top_p),
            any_seeded=any(p.seed is not None for p in params),
        )

    def _fields(self):
        return (self.inv_temperature, self.greedy, self.top_k, self.top_p, self.seed_key, self.seeded)

    def select(self, idx: torch.Tensor) -> "RowSampling":
        """Rows ``idx`` (used when finished rows leave the batch); flags stay conservative."""
        return RowSampling(*(t[idx] for t in self._fields()),
                           self.any_sample, self.any_greedy, self.any_top_k, self.any_top_p, self.any_seeded)

    @staticmethod
    def cat(parts: Sequence["RowSampling"]) -> "RowSampling":
        fields = [torch.cat(ts) for ts in zip(*(p._fields() for p in parts))]
        return RowSampling(
            *fields,
            any(p.any_sample for p in parts),
            any(p.any_greedy for p in parts),
            any(p.any_top_k for p in parts),
            any(p.any_top_p for p in parts),
            any(p.any_seeded for p in parts),
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
    cdf = torch.softmax(candidates.double(), dim=-1).cumsum(dim=-1)
    # u <= 1 - 2**-32 and the total is ~1, so the target lies far below it: the first index whose CDF
    # exceeds the target exists, and its probability is > 0 (adding 0.0 leaves a CDF value unchanged).
    target = uniforms * cdf[:, -1]
    # only a NaN row (non-finite logits) finds no index; clamped, its token stays a valid id and the engine
    # reports the row's non-finite log-prob by name instead of failing on an index out of range
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1).clamp_(max=cdf.shape[-1] - 1)


def sample_next_tokens(
    logits: torch.Tensor, rows: RowSampling, generator: torch.Generator | None, steps: torch.Tensor | None = None,
    suppress: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row from ``logits`` (B, V); return ``(tokens (B,), log_probs (B,))``.

    Greedy rows take the arg-max; sampling rows draw from ``softmax(logits / T)`` restricted to their
    top-k / top-p set: unseeded rows through Gumbel noise from ``generator`` (reproducible for a fixed
    batch composition), seeded rows by inverse CDF at the uniform of ``(seed, steps[row])``, where
    ``steps`` (B,) is the index of the token being drawn in each row's response.
    ``suppress``: token ids never drawn (a vision-language model's image/video placeholders); like top-k /
    top-p they only restrict the draw, the reported log-prob stays over the full distribution.
    """
    scaled = logits.float() * rows.inv_temperature[:, None]
    log_norm = torch.logsumexp(scaled, dim=-1)
    full = scaled
    if suppress is not None:
        scaled = scaled.index_fill(1, suppress, float("-inf"))
    if rows.any_sample:
        candidates = _filter_top_k_top_p(scaled, rows) if (rows.any_top_k or rows.any_top_p) else scaled
        if rows.all_seeded:
            tokens = inverse_cdf_sample(candidates, seeded_uniform(rows.seed_key, steps))
        else:
            noise = torch.empty_like(candidates).exponential_(generator=generator)
            tokens = (candidates - noise.log_()).argmax(dim=-1)
            if rows.seeded_rows is not None:
                idx = rows.seeded_rows
                u = seeded_uniform(rows.seed_key[idx], steps[idx])
                tokens[idx] = inverse_cdf_sample(candidates[idx], u)
        if rows.any_greedy:
            tokens = torch.where(rows.greedy, scaled.argmax(dim=-1), tokens)
    else:
        tokens = scaled.argmax(dim=-1)
    log_probs = full.gather(1, tokens[:, None]).squeeze(1) - log_norm
    return tokens, log_probs
