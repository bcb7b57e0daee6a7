"""Exact on-policy log-probs (``actor_rollout_ref.rollout.exact_log_probs``): the rollout's log-prob of every sampled
token equals, bit for bit, what the trainer computes for it (CPU, fp32).

The engine runs as always -- batched prefill, cached decode, continuous batching -- on a model whose kernels are
batch-invariant (``engine/batch_invariant.py``: MKL's strict mode for every product, an attention whose result for a
query does not depend on the batch or the padding, RMSNorm and SiLU with agreeing kernels): a token's last hidden
state and its logits are then the trainer's for the same token, whatever the batch.  What is left is the last step,
done here with the trainer's own operations: ``logits / T`` (a division by the same Python float,
``engine/forward.py``'s ``logits / temperature``, not a product by ``1 / T``), then ``z_y - logsumexp(z)``
(``algorithms/entropy.logprobs_from_logits`` and the fused head's ``torch.logsumexp``).  Rows of one temperature
are scaled together; sampling draws from the scaled logits at unit temperature.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import torch

from hybridflow.engine.batch_invariant import batch_invariance_problem, enable_strict_matmul, mark_batch_invariant
from hybridflow.rollout.hf.token_sampler import RowSampling, sample_next_tokens

__all__ = ["exact_sample", "prepare_exact_model", "scaled_like_the_trainer"]

logger = logging.getLogger(__name__)
_KEY = "actor_rollout_ref.rollout.exact_log_probs"


def prepare_exact_model(model: torch.nn.Module, vision: bool) -> None:
    """Switch ``model`` to batch-invariant kernels (``engine/batch_invariant.py``) for exact log-probs; raise naming
    the key when it cannot be exact.  Warns when MKL's strict mode could not be switched on in this process (MKL
    ran before it): the log-probs then agree with the trainer's to ~1e-7, not bit for bit."""
    problem = "a vision-language model (its vision tower is not batch-invariant)" if vision else \
        batch_invariance_problem(model)
    if problem is not None:
        raise ValueError(f"{_KEY}=true: the rollout's log-probs cannot equal the trainer's bit for bit for this model: "
                         f"{problem}. Set {_KEY}=false")
    mark_batch_invariant(model)
    if not enable_strict_matmul():
        logger.warning("%s: MKL's strict reproducibility mode is off in this process (it must be set before its "
                       "first matrix product: MKL_CBWR=AUTO,STRICT); rollout log-probs will match the trainer's to "
                       "~1e-7, not bit for bit", _KEY)


def scaled_like_the_trainer(logits: torch.Tensor, temperatures: Sequence[float]) -> torch.Tensor:
    """``(B, V)`` float32 ``logits / T`` per row, divided as the trainer divides (by the Python float)."""
    temps = [float(t) for t in temperatures]
    if len(set(temps)) == 1:
        return (logits / temps[0]).float()
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    for t in set(temps):
        rows = torch.tensor([i for i, x in enumerate(temps) if x == t], device=logits.device)
        out[rows] = (logits[rows] / t).float()
    return out


def exact_sample(logits: torch.Tensor, params: Sequence, sampling: RowSampling, generator: torch.Generator | None,
                 steps: torch.Tensor, suppress: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row from ``logits`` (B, V) with the trainer's scaling; ``(tokens, log_probs)``.  ``params``: each
    row's ``SamplingParams`` (None for a finished row)."""
    temps = [p.logprob_temperature if p is not None else 1.0 for p in params]
    scaled = scaled_like_the_trainer(logits, temps)
    unit = dataclasses.replace(sampling, inv_temperature=torch.ones_like(sampling.inv_temperature))
    return sample_next_tokens(scaled, unit, generator, steps, suppress)
