"""``trainer.balance_batch``: reorder a batch so every data-parallel rank gets the same token load.

Worker groups split a batch into ``dp_size`` contiguous chunks.  With long-tailed response lengths one rank
can receive most of the long sequences and every other rank waits for it.  verl reorders with the
Karmarkar-Karp differencing heuristic; we use the simpler *longest-processing-time-first* greedy
(Graham 1969, "Bounds on multiprocessing timing anomalies") under an equal-count constraint: take samples
from the heaviest down and give each to the lightest rank that still has room.  LPT is within 4/3 of the
optimal makespan, which is plenty when a rank holds tens of samples.

Workload per sample follows verl's cost model ``24576 * L + L**2`` (linear MLP/projection cost plus the
quadratic attention term; the constant is a typical hidden-size ratio), with ``L`` = attention-mask length.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from hybridflow.protocol import DataProto

LINEAR_COST = 24576


def sample_workloads(attention_mask: torch.Tensor) -> np.ndarray:
    lengths = attention_mask.sum(-1).to(torch.float64).numpy()
    return LINEAR_COST * lengths + lengths**2


def equal_size_partitions(workloads: np.ndarray, k: int) -> list[list[int]]:
    """Split indices into ``k`` lists of equal size (len must divide) with near-equal workload sums."""
    n = len(workloads)
    if k <= 0 or n % k != 0:
        raise ValueError(f"balance_batch: {n} samples cannot be split evenly over {k} data-parallel ranks")
    cap = n // k
    parts: list[list[int]] = [[] for _ in range(k)]
    heap = [(0.0, r) for r in range(k)]  # (load, rank) of ranks that still have room
    for idx in np.argsort(-workloads, kind="stable"):
        load, rank = heapq.heappop(heap)
        parts[rank].append(int(idx))
        if len(parts[rank]) < cap:
            heapq.heappush(heap, (load + float(workloads[idx]), rank))
    return [sorted(p) for p in parts]


def balance_batch(batch: DataProto, dp_size: int) -> dict[str, float]:
    """Reorder ``batch`` in place for ``dp_size`` ranks; returns verl's ``global_seqlen/*`` metrics."""
    mask = batch.batch["attention_mask"]
    seqlens = mask.sum(-1).to(torch.float64).numpy()
    n = len(batch)
    if n == 0:
        return {}
    if dp_size <= 1 or n % dp_size != 0:
        # One rank, or an uneven batch the dispatcher pads later: nothing to balance.
        chunks = [list(range(n))]
        parts = chunks
    else:
        size = n // dp_size
        chunks = [list(range(r * size, (r + 1) * size)) for r in range(dp_size)]
        parts = equal_size_partitions(sample_workloads(mask), dp_size)
        batch.reorder(torch.tensor([i for p in parts for i in p], dtype=torch.long))
    before = [float(seqlens[c].sum()) for c in chunks]
    after = [float(seqlens[p].sum()) for p in parts]
    return {
        "global_seqlen/min": min(before),
        "global_seqlen/max": max(before),
        "global_seqlen/minmax_diff": max(before) - min(before),
        "global_seqlen/balanced_min": min(after),
        "global_seqlen/balanced_max": max(after),
        "global_seqlen/mean": float(np.mean(after)),
    }


__all__ = ["balance_batch", "equal_size_partitions", "sample_workloads"]
