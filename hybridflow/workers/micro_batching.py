"""Micro-batch plans shared by the actor, critic, reference and reward-model workers.

A ``MicroBatchSpec`` says how one rank splits its data: a fixed number of rows per micro-batch
(``*_micro_batch_size_per_gpu``) or a token budget (``use_dynamic_bsz`` + ``*_max_token_len_per_gpu``).
``split_micro_batches`` applies it and returns the permutation needed to restore row order.

With Ulysses sequence parallelism the sp ranks of a group share each micro-batch, each holding 1/sp of its
tokens, so the token budget of a micro-batch is ``*_max_token_len_per_gpu x sp`` (verl's rule): every device
still sees at most its per-GPU budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.engine.micro_batch import rearrange_micro_batches, restore_order, split_fixed
from hybridflow.protocol import DataProto

__all__ = ["MicroBatchSpec", "split_micro_batches", "gather_in_order", "normalize_mini_batch_size"]


@dataclass(frozen=True)
class MicroBatchSpec:
    use_dynamic_bsz: bool
    micro_batch_size: int | None
    max_token_len: int
    field: str  # config key named in errors


def split_micro_batches(data: DataProto, spec: MicroBatchSpec, dp_group=None,
                        sp: int = 1) -> tuple[list[DataProto], list[list[int]] | None]:
    """Micro-batches of ``data`` and, for dynamic batching, the row indices of each (``sp``: the sequence-parallel
    size, which multiplies the token budget).  The micro-batch count is agreed over ``dp_group`` (default: all
    ranks; sp peers hold the same rows, so they agree anyway)."""
    if spec.use_dynamic_bsz:
        return rearrange_micro_batches(data, spec.max_token_len * int(sp), dp_group)
    return split_fixed(data, spec.micro_batch_size, spec.field), None


def gather_in_order(outputs: list[torch.Tensor], parts: list[list[int]] | None) -> torch.Tensor:
    """Concatenate per-micro-batch outputs back into the row order of the data that was split."""
    return torch.cat(outputs, dim=0) if parts is None else restore_order(outputs, parts)


def normalize_mini_batch_size(ppo_mini_batch_size: int, rollout_n: int, dp_size: int, field: str) -> int:
    """Rows per rank in one mini-batch: ``ppo_mini_batch_size`` prompts x ``rollout.n`` / DP size.

    verl's configs count mini-batches in *prompts* across the whole job; each rank trains on its
    share of the trajectories, so the product must split evenly over the data-parallel ranks.
    """
    total = int(ppo_mini_batch_size) * int(rollout_n)
    if ppo_mini_batch_size <= 0:
        raise ValueError(f"{field}={ppo_mini_batch_size} must be a positive number of prompts")
    if total % dp_size:
        raise ValueError(
            f"{field}={ppo_mini_batch_size} prompts x rollout.n={rollout_n} = {total} trajectories per mini-batch "
            f"cannot be split over {dp_size} data-parallel ranks; choose {field} so that "
            f"{field} x rollout.n is a multiple of {dp_size}"
        )
    return total // dp_size
