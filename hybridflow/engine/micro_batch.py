"""Split a per-rank batch into micro-batches: fixed size, or balanced under a token budget.

Dynamic batching (verl's ``use_dynamic_bsz`` + ``*_max_token_len_per_gpu``) packs sequences of very
different lengths into micro-batches whose *token* counts are even, so a micro-batch of long
responses does not run out of memory while one of short responses wastes the device.  We:

1. count valid tokens per sequence (``attention_mask.sum(-1)``),
2. take ``k = ceil(total_tokens / budget)`` micro-batches (more if a balanced split still breaks the
   budget), then **all-reduce MAX over the data-parallel group** so every rank runs the same number
   of forward/backward passes -- FSDP's collectives need every rank to step together,
3. balance the sequences over the ``k`` bins with the Longest-Processing-Time greedy rule (sort by
   length, put each sequence into the currently lightest bin; Graham 1969, a 4/3-approximation of
   the optimal makespan),
4. remember the permutation so per-sequence outputs are put back in the input order.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import torch
import torch.distributed as dist

from hybridflow.engine.device import get_device
from hybridflow.protocol import DataProto

__all__ = [
    "split_fixed",
    "balanced_partitions",
    "num_micro_batches_for_budget",
    "rearrange_micro_batches",
    "restore_order",
    "sequence_lengths",
]


def sequence_lengths(data: DataProto) -> list[int]:
    """Valid (attended) tokens of each row."""
    return data.batch["attention_mask"].sum(-1).tolist()


def split_fixed(data: DataProto, micro_batch_size: int, field: str = "ppo_micro_batch_size_per_gpu") -> list[DataProto]:
    if micro_batch_size is None or int(micro_batch_size) <= 0:
        raise ValueError(
            f"{field} must be a positive integer when dynamic batch size is off (got {micro_batch_size}); "
            "set it, or set use_dynamic_bsz=true with a token budget"
        )
    return data.split(int(micro_batch_size))


def balanced_partitions(lengths: Sequence[int], k: int) -> list[list[int]]:
    """LPT-greedy partition of indices into ``k`` non-empty bins with near-equal length sums."""
    n = len(lengths)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} sequences into {k} non-empty micro-batches")
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = [[] for _ in range(k)]
    # The first k (longest) sequences seed the k bins so none stays empty.
    heap = []
    for b, i in enumerate(order[:k]):
        bins[b].append(i)
        heap.append((lengths[i], b))
    heapq.heapify(heap)
    for i in order[k:]:
        load, b = heapq.heappop(heap)
        bins[b].append(i)
        heapq.heappush(heap, (load + lengths[i], b))
    return [sorted(b) for b in bins]


def _fits(parts: list[list[int]], lengths: Sequence[int], budget: int) -> bool:
    return all(sum(lengths[i] for i in p) <= budget for p in parts)


def num_micro_batches_for_budget(lengths: Sequence[int], budget: int, dp_group=None) -> int:
    """Smallest ``k`` whose balanced split respects ``budget`` here, then the MAX over ``dp_group``."""
    n = len(lengths)
    longest = max(lengths) if n else 0
    if longest > budget:
        raise ValueError(
            f"a sequence has {longest} tokens but the token budget per micro-batch is {budget}; raise "
            "ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu to at least "
            "max_prompt_length + max_response_length"
        )
    k = min(n, max(1, math.ceil(sum(lengths) / budget)))
    while k < n and not _fits(balanced_partitions(lengths, k), lengths, budget):
        k += 1
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(dp_group) > 1:
        t = torch.tensor([k], dtype=torch.int64, device=get_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=dp_group)
        k = min(n, int(t.item()))  # ranks hold equal-size chunks, so n bounds every rank's k
    return k


def rearrange_micro_batches(
    data: DataProto, max_token_len: int, dp_group=None, num_micro_batches: int | None = None
) -> tuple[list[DataProto], list[list[int]]]:
    """Token-budget micro-batches and, for each, the row indices of ``data`` it holds."""
    lengths = sequence_lengths(data)
    k = num_micro_batches or num_micro_batches_for_budget(lengths, int(max_token_len), dp_group)
    parts = balanced_partitions(lengths, k)
    return [data.select_idxs(p) for p in parts], parts


def restore_order(outputs: Sequence[torch.Tensor], parts: list[list[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs and undo the permutation made by ``rearrange_micro_batches``."""
    cat = torch.cat(list(outputs), dim=0)
    flat = [i for p in parts for i in p]
    inverse = torch.empty(len(flat), dtype=torch.long)
    inverse[torch.tensor(flat, dtype=torch.long)] = torch.arange(len(flat))
    return cat[inverse]
