"""DataProto: the one batch container. Semantics checked on small hand-made batches."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from hybridflow.protocol import BatchSizeError, DataProto


def make(n=4):
    return DataProto.from_dict(
        tensors={"x": torch.arange(n * 2).view(n, 2), "m": torch.ones(n, 3)},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "gt": [{"a": i} for i in range(n)]},
        meta_info={"temperature": 1.0},
    )


def test_construction_and_len():
    d = make()
    assert len(d) == 4
    assert d.batch.batch_size[0] == 4
    assert d.non_tensor_batch["gt"].dtype == object and d.non_tensor_batch["gt"][2] == {"a": 2}


def test_mismatched_batch_sizes_are_named():
    with pytest.raises(BatchSizeError, match="x=3, uid=2"):
        DataProto.from_dict(tensors={"x": torch.zeros(3)}, non_tensors={"uid": ["a", "b"]})


def test_select_pop_rename():
    d = make()
    s = d.select(batch_keys=["x"], non_tensor_batch_keys=["uid"])
    assert list(s.batch) == ["x"] and list(s.non_tensor_batch) == ["uid"] and s.meta_info == {"temperature": 1.0}
    with pytest.raises(KeyError, match="not in batch"):
        d.select(batch_keys=["nope"])
    popped = d.pop(batch_keys=["m"])
    assert "m" not in d.batch and "m" in popped.batch
    d.rename("x", "y")
    assert "y" in d.batch


def test_union_checks_conflicts():
    a, b = make(), make()
    b = b.select(batch_keys=["x"], non_tensor_batch_keys=[])
    b.batch["z"] = torch.zeros(4)
    a.union(b)
    assert "z" in a.batch
    c = make()
    c.batch["x"] = c.batch["x"] + 1
    with pytest.raises(ValueError, match="key 'x' exists in both"):
        make().union(c)


def test_chunk_split_concat_roundtrip():
    d = make(6)
    parts = d.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["x"], d.batch["x"]) and list(back.non_tensor_batch["uid"]) == list(d.non_tensor_batch["uid"])
    assert [len(p) for p in d.split(4)] == [4, 2]
    with pytest.raises(BatchSizeError, match="pad_to_divisor"):
        d.chunk(4)


def test_concat_merges_metrics():
    a, b = make(2), make(2)
    a.meta_info["metrics"] = {"loss": [1.0]}
    b.meta_info["metrics"] = {"loss": [2.0]}
    assert DataProto.concat([a, b]).meta_info["metrics"] == {"loss": [1.0, 2.0]}


def test_repeat_interleave_and_tile():
    d = make(2)
    r = d.repeat(3, interleave=True)
    assert list(r.non_tensor_batch["uid"]) == ["u0", "u0", "u0", "u1", "u1", "u1"]
    t = d.repeat(2, interleave=False)
    assert list(t.non_tensor_batch["uid"]) == ["u0", "u1", "u0", "u1"]
    assert torch.equal(t.batch["x"][2], d.batch["x"][0])


def test_reorder_and_indexing():
    d = make(4)
    d.reorder(torch.tensor([3, 2, 1, 0]))
    assert list(d.non_tensor_batch["uid"]) == ["u3", "u2", "u1", "u0"]
    assert len(d[1:3]) == 2 and d[0].non_tensor_batch["uid"] == "u3"  # one row: a DataProtoItem, as in verl
    mask = np.array([True, False, True, False])
    assert list(d.select_idxs(mask).non_tensor_batch["uid"]) == ["u3", "u1"]
    assert torch.equal(d["x"], d.batch["x"])


def test_pad_to_divisor_and_unpad():
    d = make(5)
    padded, pad = d.pad_to_divisor(4)
    assert pad == 3 and len(padded) == 8
    assert list(padded.non_tensor_batch["uid"][5:]) == ["u0", "u1", "u2"]
    assert len(padded.unpad(pad)) == 5
    same, zero = d.pad_to_divisor(5)
    assert zero == 0 and same is d


def test_make_iterator_is_seeded():
    d = make(6)
    a = [list(m.non_tensor_batch["uid"]) for m in d.make_iterator(2, epochs=2, seed=3, shuffle=True)]
    b = [list(m.non_tensor_batch["uid"]) for m in d.make_iterator(2, epochs=2, seed=3, shuffle=True)]
    assert a == b and len(a) == 6


def test_pickle_and_disk_roundtrip(tmp_path):
    d = make()
    e = pickle.loads(pickle.dumps(d))
    assert torch.equal(e.batch["x"], d.batch["x"]) and e.non_tensor_batch["gt"][1] == {"a": 1}
    p = tmp_path / "d.pkl"
    d.save_to_disk(p)
    f = DataProto.load_from_disk(p)
    assert f.meta_info == d.meta_info and list(f.non_tensor_batch["uid"]) == list(d.non_tensor_batch["uid"])


def test_from_single_dict_splits_kinds():
    d = DataProto.from_single_dict({"ids": torch.zeros(2, 3), "src": ["a", "b"]})
    assert list(d.batch) == ["ids"] and list(d.non_tensor_batch) == ["src"]
