"""Micro-batch splitting: balanced partitions, token budget, order restoration, batch-size errors."""

import pytest
import torch

from hybridflow.engine.micro_batch import (
    balanced_partitions,
    num_micro_batches_for_budget,
    rearrange_micro_batches,
    restore_order,
)
from hybridflow.protocol import DataProto
from hybridflow.workers.micro_batching import normalize_mini_batch_size


def test_lpt_partition_golden():
    # LPT on [7, 5, 4, 3, 3, 2] into 2 bins: 7|5 -> 7|5+4 -> 7+3|9 -> 10|9+3 -> 10+2|12
    parts = balanced_partitions([7, 5, 4, 3, 3, 2], 2)
    sums = sorted(sum([7, 5, 4, 3, 3, 2][i] for i in p) for p in parts)
    assert sums == [12, 12]
    assert sorted(i for p in parts for i in p) == list(range(6))


def test_budget_decides_the_number_of_micro_batches():
    lengths = [10, 9, 8, 3, 2, 1]
    assert num_micro_batches_for_budget(lengths, 100) == 1
    k = num_micro_batches_for_budget(lengths, 12)
    parts = balanced_partitions(lengths, k)
    assert all(sum(lengths[i] for i in p) <= 12 for p in parts)
    assert k == 3  # ceil(33 / 12) = 3 and the balanced split fits
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu"):
        num_micro_batches_for_budget(lengths, 9)


def test_rearrange_and_restore_order_round_trip():
    mask = torch.tensor([[1] * n + [0] * (6 - n) for n in (6, 1, 5, 2, 4, 3)])
    data = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(6)})
    micro, parts = rearrange_micro_batches(data, max_token_len=8)
    assert len(micro) == 3 and all(int(mb.batch["attention_mask"].sum()) <= 8 for mb in micro)
    restored = restore_order([mb.batch["row"] * 10 for mb in micro], parts)
    assert restored.tolist() == [0, 10, 20, 30, 40, 50]


def test_mini_batch_size_normalisation():
    assert normalize_mini_batch_size(4, 8, 2, "actor.ppo_mini_batch_size") == 16
    with pytest.raises(ValueError, match=r"3 prompts x rollout.n=1 = 3 trajectories .* 2 data-parallel ranks"):
        normalize_mini_batch_size(3, 1, 2, "actor.ppo_mini_batch_size")
