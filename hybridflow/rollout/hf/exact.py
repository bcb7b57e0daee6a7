"""Exact on-policy next-token distributions (``actor_rollout_ref.rollout.exact_log_probs``).

The cached decode step computes a new token's logits from one query row against the K/V cache; the actor's
recomputation (``old_log_prob``) runs the whole sequence at once.  Both are the same function of the same
weights, but not the same arithmetic: a matrix product with 1 to 7 rows takes a different CPU kernel (another
reduction order) than one with many rows, and attention over a cache is another kernel than causal attention
over the sequence.  The log-probs then agree to ~1e-7, not bit for bit, and the PPO ratio of the first update
is not exactly 1.

In exact mode every next-token distribution of the rollout is computed the way the actor computes it: a full
forward of the row's tokens so far (no cache), ``logits / temperature`` with the same Python float, and the
log-prob by :func:`hybridflow.algorithms.entropy.logprobs_from_logits`.  Shapes are made batch-invariant: every
row is right-padded to a multiple of :data:`LENGTH_QUANTUM` tokens (padding *after* a causal row cannot change
it, and no product has fewer rows than the small-matrix kernels take), and rows of one padded width are batched
together (a row's arithmetic does not depend on its neighbours).  Measured on CPU fp32 (the
``exact`` tests): the rollout's per-token log-probs equal the actor's trimmed and packed recomputation bit for
bit.  The cost is a forward over the whole row per generated token (quadratic in the response length instead
of linear); ``benchmarks/RESULTS.md`` has the numbers.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Sequence

import torch

from hybridflow.engine.transformers_adapter import text_config
from hybridflow.rollout.hf.token_sampler import RowSampling, sample_next_tokens

__all__ = ["LENGTH_QUANTUM", "exact_log_probs", "exact_next_tokens", "exact_scaled_logits"]

LENGTH_QUANTUM = 16  # fewer than 8 rows take another sgemm kernel on CPU; 16 keeps every product above that


def exact_scaled_logits(model: torch.nn.Module, sequences: Sequence[Sequence[int] | None],
                        temperatures: Sequence[float], pad_token_id: int, device: torch.device,
                        vocab_size: int) -> torch.Tensor:
    """``(B, V)`` float32: the logits of the token after each sequence, divided by its temperature.

    ``None`` entries (rows that finished) get zeros.  Rows are right-padded to a multiple of
    :data:`LENGTH_QUANTUM`; rows of one padded width and temperature share one forward (a causal row is not
    changed by padding after it, nor by its neighbours).
    """
    out: torch.Tensor | None = None
    groups: dict[tuple[int, float], list[int]] = defaultdict(list)
    for i, seq in enumerate(sequences):
        if seq is not None:
            groups[(-(-len(seq) // LENGTH_QUANTUM) * LENGTH_QUANTUM, float(temperatures[i]))].append(i)
    for (width, temperature), rows in groups.items():
        ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long, device=device)
        lengths = torch.tensor([len(sequences[r]) for r in rows], device=device)
        for j, r in enumerate(rows):
            ids[j, :len(sequences[r])] = torch.tensor(list(sequences[r]), dtype=torch.long, device=device)
        # every position's logits (no logits_to_keep): the lm_head product then has as many rows as the actor's
        logits = model(input_ids=ids, use_cache=False).logits
        logits = logits[torch.arange(len(rows), device=device), lengths - 1]
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if out is None:
            out = torch.zeros(len(sequences), logits.shape[-1], dtype=torch.float32, device=device)
        out[torch.tensor(rows, device=device)] = logits / temperature  # the actor's op and operand (engine/forward)
    return out if out is not None else torch.zeros(len(sequences), vocab_size, dtype=torch.float32, device=device)


def exact_log_probs(scaled: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``tokens`` under ``scaled`` logits, with the actor's function."""
    from hybridflow.algorithms.entropy import logprobs_from_logits

    return logprobs_from_logits(scaled, tokens)


def exact_next_tokens(model: torch.nn.Module, sequences: Sequence[Sequence[int] | None], params: Sequence,
                      sampling: RowSampling, generator: torch.Generator, steps: torch.Tensor,
                      suppress: torch.Tensor | None, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step in exact mode: sample each live row's next token from the actor's own arithmetic (the
    scaled logits of a full forward, drawn from at unit temperature) and return ``(tokens, log_probs)``."""
    temps = [p.logprob_temperature if p is not None else 1.0 for p in params]
    device = next(model.parameters()).device
    scaled = exact_scaled_logits(model, sequences, temps, pad_token_id, device, text_config(model.config).vocab_size)
    unit = dataclasses.replace(sampling, inv_temperature=torch.ones_like(sampling.inv_temperature))
    tokens, _ = sample_next_tokens(scaled, unit, generator, steps, suppress)
    return tokens, exact_log_probs(scaled, tokens)
