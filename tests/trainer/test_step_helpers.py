"""Pure controller helpers: DAPO group filtering and DP load balancing (hand-computed expectations)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.balance import balance_batch, equal_size_partitions
from hybridflow.trainer.dynamic_sampling import GroupFilterAccumulator, informative_group_mask


def _scored(uids, scores, acc=None):
    scores_t = torch.zeros(len(scores), 3)
    scores_t[:, -1] = torch.tensor(scores, dtype=torch.float32)
    non = {"uid": list(uids)}
    if acc is not None:
        non["acc"] = list(acc)
    return DataProto.from_dict({"token_level_scores": scores_t}, non)


def test_informative_group_mask_drops_zero_variance_groups():
    batch = _scored(["a", "a", "b", "b", "c"], [1.0, 1.0, 0.0, 1.0, 0.0])
    # group a: all equal -> dropped; b: varies -> kept; c: singleton -> kept
    assert informative_group_mask(batch, "seq_reward").tolist() == [False, False, True, True, True]
    batch = _scored(["a", "a", "b", "b"], [1.0, 0.5, 0.0, 0.0], acc=[True, True, False, True])
    assert informative_group_mask(batch, "acc").tolist() == [False, False, True, True]
    with pytest.raises(KeyError, match="filter_groups.metric"):
        informative_group_mask(batch, "missing")


def test_accumulator_collects_until_full_and_truncates():
    acc = GroupFilterAccumulator(target_prompts=2, n=2, metric="seq_reward", max_num_gen_batches=3)
    acc.add(_scored(["a", "a", "b", "b"], [1, 1, 0, 1]))  # only b informative
    assert not acc.full
    acc.add(_scored(["c", "c", "d", "d"], [0, 1, 1, 0]))  # c and d informative
    assert acc.full
    out = acc.take()
    assert list(out.non_tensor_batch["uid"]) == ["b", "b", "c", "c"]
    assert acc.metrics() == {"train/num_gen_batches": 2.0, "train/filter_groups_kept_ratio": 0.75,
                             "train/zero_variance_group_fraction": 0.25}


def test_accumulator_budget_error_is_clear():
    acc = GroupFilterAccumulator(target_prompts=4, n=2, metric="seq_reward", max_num_gen_batches=1)
    acc.add(_scored(["a", "a"], [1, 1]))
    with pytest.raises(RuntimeError, match="max_num_gen_batches=1"):
        acc.check_budget()
    unlimited = GroupFilterAccumulator(target_prompts=4, n=2, metric="seq_reward", max_num_gen_batches=0)
    unlimited.add(_scored(["a", "a"], [1, 1]))
    unlimited.check_budget()  # <= 0 means unbounded


def test_equal_size_partitions_lpt():
    # loads 10, 9, 8, 7, 1, 1 into 2 ranks of 3: LPT gives {10,7,1}=18 and {9,8,1}=18
    parts = equal_size_partitions(np.array([10.0, 9, 8, 7, 1, 1]), 2)
    sums = sorted(sum([10, 9, 8, 7, 1, 1][i] for i in p) for p in parts)
    assert sums == [18, 18] and all(len(p) == 3 for p in parts)
    with pytest.raises(ValueError, match="evenly"):
        equal_size_partitions(np.ones(5), 2)


def test_balance_batch_reorders_rows_consistently():
    lengths = [8, 8, 1, 1]
    mask = torch.zeros(4, 8, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    batch = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(4)}, {"tag": ["p", "q", "r", "s"]})
    metrics = balance_batch(batch, dp_size=2)
    assert metrics["global_seqlen/max"] == 16 and metrics["global_seqlen/min"] == 2
    assert metrics["global_seqlen/balanced_max"] == 9 and metrics["global_seqlen/balanced_min"] == 9
    rows = batch.batch["row"].tolist()
    assert sorted(rows) == [0, 1, 2, 3]
    assert [batch.non_tensor_batch["tag"][i] for i in range(4)] == [["p", "q", "r", "s"][r] for r in rows]
    assert batch.batch["attention_mask"][:2].sum() == 9
