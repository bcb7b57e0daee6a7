"""``actor.use_torch_compile`` / ``ref.use_torch_compile``: the log-prob and entropy kernels through ``torch.compile``.

verl compiles its entropy-from-logits function when ``use_torch_compile`` is true (its default).  Here the two
per-chunk kernels that turn (rows, V) logits into log π(label) and H(π) are compiled -- logsumexp, gather and
softmax·z fuse into one pass over the vocabulary instead of several, in the forward and the backward.

Where it helps, measured with ``benchmarks/bench_compile.py`` (2026-11-23, this project's shared 2-core CPU VM
at load ~10, one thread, fp32, 512 rows; compiled / eager time per call):

    V        log-prob fwd+bwd   entropy fwd   first (compiling) call
    100      0.80 (0.36 ms)     0.34          13 s + 5 s
    2048     0.41 (19.6 ms)     0.51
    8192     0.82 (66.6 ms)     0.32
    32000    0.37 (745 ms)      0.47

Compiling costs ~20 s (up to ~40 s cold) once per process (inductor generates and builds C++).  Over a real
vocabulary the kernel saves tens to hundreds of ms per micro-batch and repays that within the first steps; at
V=100 it saves ~0.1 ms per call and would need ~10^5 calls.  So the compiled kernels are
used when ``use_torch_compile`` is true **and** the vocabulary has at least ``COMPILE_MIN_VOCAB`` entries; the
char-level test models (V < 100) stay eager.  The rule is the same on GPU (not measured in this environment).
Outputs agree with the eager kernels to ~2e-6 (fp32).
"""

from __future__ import annotations

import torch

__all__ = ["COMPILE_MIN_VOCAB", "compiled_logprob", "compiled_entropy", "wants_compiled"]

COMPILE_MIN_VOCAB = 2048

_CACHE: dict[str, object] = {}


def wants_compiled(use_torch_compile: bool, vocab_size: int) -> bool:
    return bool(use_torch_compile) and vocab_size >= COMPILE_MIN_VOCAB


def _logprob(chunk: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return chunk.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(chunk, dim=-1)


def _entropy(chunk: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(chunk, dim=-1) - (torch.softmax(chunk, dim=-1) * chunk).sum(dim=-1)


def _compiled(name: str, fn):
    if name not in _CACHE:
        _CACHE[name] = torch.compile(fn, dynamic=True)  # one graph for every chunk length
    return _CACHE[name]


def compiled_logprob(chunk: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(label) per row of fp32 (rows, V) logits, compiled."""
    return _compiled("logprob", _logprob)(chunk, labels)


def compiled_entropy(chunk: torch.Tensor) -> torch.Tensor:
    """H(π) per row of fp32 (rows, V) logits, compiled."""
    return _compiled("entropy", _entropy)(chunk)
