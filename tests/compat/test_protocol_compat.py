"""verl's ``verl.protocol`` API at ``hybridflow.protocol``: calls written for verl give verl's results.

Written from verl's documented behaviour (its docstrings and tests of Aug 2026): where verl asserts, the error
here is an ``AssertionError`` too (and the type that names the problem).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from hybridflow.protocol import (
    DataProto,
    TensorBatch,
    DataProtoConfig,
    DataProtoFuture,
    DataProtoItem,
    deserialize_single_tensor,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    serialize_single_tensor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)


def rows(n=3, meta=None):
    return DataProto.from_dict(tensors={"obs": torch.arange(2 * n).view(n, 2)},
                               non_tensors={"labels": [chr(ord("a") + i) for i in range(n)]},
                               meta_info=dict(meta or {"info": "x"}))


# --------------------------------------------------------------------------------------------- construction
def test_from_dict_num_batch_dims_is_checked_then_refused_as_in_verl():
    obs, act = torch.zeros(6, 4), torch.zeros(6, 4, 3)
    assert DataProto.from_dict(tensors={"obs": obs, "act": act}).batch.batch_size == torch.Size([6])
    with pytest.raises(AssertionError):  # leading dims agree, but a DataProto has one batch dim
        DataProto.from_dict(tensors={"obs": obs, "act": act}, num_batch_dims=2)
    with pytest.raises(AssertionError, match="same batch size"):  # (6, 4, 3)[:3] != (6, 4)
        DataProto.from_dict(tensors={"obs": obs, "act": act}, num_batch_dims=3)
    with pytest.raises(AssertionError, match="greater than zero"):
        DataProto.from_dict(tensors={"obs": obs}, num_batch_dims=0)
    with pytest.raises(AssertionError, match="non_tensors"):
        DataProto.from_dict(tensors={"obs": obs}, non_tensors={}, num_batch_dims=2)


def test_auto_padding_lets_chunk_split_unevenly():
    plain = rows(5)
    with pytest.raises(AssertionError):
        plain.chunk(2)
    padded = DataProto.from_dict(tensors={"obs": torch.arange(5)}, auto_padding=True)
    assert padded.is_padding_enabled() and not plain.is_padding_enabled()
    assert [len(p) for p in padded.chunk(2)] == [3, 2]
    assert torch.equal(DataProto.concat(padded.chunk(2)).batch["obs"], torch.arange(5))


def test_data_proto_config_switch_is_process_wide_and_type_checked(monkeypatch):
    assert DataProtoConfig.auto_padding is False
    DataProtoConfig.auto_padding = True
    try:
        assert rows(5).is_padding_enabled() and len(rows(5).chunk(2)) == 2
    finally:
        DataProtoConfig.auto_padding = False
    with pytest.raises(AssertionError):
        DataProtoConfig.auto_padding = "yes"
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    assert DataProtoConfig.auto_padding is True


def test_integer_index_is_one_row_other_indices_are_batches():
    d = DataProto.from_dict(tensors={"obs": torch.arange(8).view(4, 2)},
                            non_tensors={"reward_model": [{"ground_truth": str(i)} for i in range(4)]})
    item = d[2]
    assert isinstance(item, DataProtoItem)
    assert torch.equal(item.batch["obs"], torch.tensor([4, 5]))
    assert item.non_tensor_batch["reward_model"]["ground_truth"] == "2"  # what verl reward managers read
    assert isinstance(d[np.int64(1)], DataProtoItem)
    for index in ([0, 2], np.array([0, 2]), torch.tensor([0, 2]), [True, False, True, False],
                  torch.tensor([True, False, True, False])):
        sub = d[index]
        assert isinstance(sub, DataProto) and sub.batch.batch_size == torch.Size([2])
        assert [r["ground_truth"] for r in sub.non_tensor_batch["reward_model"]] == ["0", "2"]
    assert len(d[1:3]) == 2
    with pytest.raises(TypeError):
        d[1.5]


# --------------------------------------------------------------------------------------------- repeat & pad
def test_sample_level_repeat_takes_any_sequence_of_counts():
    d = rows(3)
    for counts in ([3, 1, 2], (3, 1, 2), np.array([3, 1, 2]), torch.tensor([3, 1, 2])):
        r = d.sample_level_repeat(counts)
        assert list(r.non_tensor_batch["labels"]) == ["a", "a", "a", "b", "c", "c"]
        assert r.batch["obs"][:, 0].tolist() == [0, 0, 0, 2, 4, 4]
        assert r.meta_info == {"info": "x"}
    assert len(d.sample_level_repeat([0, 1, 0])) == 1
    with pytest.raises(AssertionError):
        d.sample_level_repeat(2)  # verl asserts on the type
    with pytest.raises(AssertionError):
        d.sample_level_repeat(torch.tensor([[1, 1, 1]]))


def test_padding_appends_the_last_or_first_row_in_place():
    d = rows(3)
    assert d.padding(0) is None and len(d) == 3
    d.padding(2)
    assert list(d.non_tensor_batch["labels"]) == ["a", "b", "c", "c", "c"]
    assert d.meta_info == {"info": "x"}
    e = rows(3)
    e.padding(1, padding_candidate="first")
    assert list(e.non_tensor_batch["labels"]) == ["a", "b", "c", "a"] and e.batch["obs"][-1].tolist() == [0, 1]


def test_pad_to_divisor_cycles_through_the_rows_and_unpads():
    d = rows(3)
    padded, pad = pad_dataproto_to_divisor(d, 7)
    assert pad == 4 and list(padded.non_tensor_batch["labels"]) == list("abcabca")
    assert padded.meta_info == {"info": "x"}
    assert list(unpad_dataproto(padded, pad).non_tensor_batch["labels"]) == list("abc")
    same, zero = pad_dataproto_to_divisor(d, 3)
    assert zero == 0 and len(same) == 3


def test_unfold_column_chunks_cuts_split_keys_and_repeats_the_rest():
    d = DataProto.from_dict(tensors={"obs1": torch.arange(1, 13).view(3, 4), "obs2": torch.tensor([[1, 2], [5, 6], [9, 10]])},
                            non_tensors={"labels": [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]]}, meta_info={"name": "abc"})
    out = d.unfold_column_chunks(2, split_keys=["obs1", "labels"])
    assert out.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    assert out.batch["obs2"].tolist() == [[1, 2], [1, 2], [5, 6], [5, 6], [9, 10], [9, 10]]
    assert out.non_tensor_batch["labels"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]
    assert out.non_tensor_batch["labels"].shape == (6, 1)  # verl's layout: one column per element of a chunk
    assert (out.non_tensor_batch["labels"] == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]).all()
    assert out.meta_info == {"name": "abc"}
    three_d = DataProto.from_dict(tensors={"x": torch.arange(24).view(3, 4, 2)})
    assert three_d.unfold_column_chunks(2, ["x"]).batch["x"].shape == (6, 2, 2)
    no_keys = d.unfold_column_chunks(2)  # verl crashes here; everything is repeated
    assert no_keys.batch["obs1"].shape == (6, 4)
    with pytest.raises(AssertionError):
        d.unfold_column_chunks(3, ["obs1"])  # 4 columns do not cut into 3


def test_fold_and_unfold_batch_dim_round_trip():
    d = rows(3).repeat(2, interleave=True)
    folded = fold_batch_dim(d, new_batch_size=3)
    assert folded.batch["obs"].tolist() == [[[0, 1], [0, 1]], [[2, 3], [2, 3]], [[4, 5], [4, 5]]]
    assert folded.non_tensor_batch["labels"].tolist() == [["a", "a"], ["b", "b"], ["c", "c"]]
    assert len(folded) == 3
    folded.reorder(torch.tensor([1, 2, 0]))
    flat = unfold_batch_dim(folded, batch_dims=2)
    assert flat.batch["obs"][:, 0].tolist() == [2, 2, 4, 4, 0, 0]
    assert list(flat.non_tensor_batch["labels"]) == ["b", "b", "c", "c", "a", "a"]
    assert flat.meta_info == {"info": "x"}
    with pytest.raises(AssertionError):
        fold_batch_dim(d, new_batch_size=4)


# --------------------------------------------------------------------------------------------- concat & union
def test_concat_flattens_metrics_given_as_lists_of_dicts():
    parts = [DataProto.from_dict(tensors={"obs": torch.tensor([i])},
                                 meta_info={"metrics": [{"loss": 0.1 * i, "acc": float(i)}], "flag": True})
             for i in range(3)]
    out = DataProto.concat(parts)
    assert out.batch["obs"].tolist() == [0, 1, 2]
    assert out.meta_info["metrics"] == {"loss": [0.0, 0.1, 0.2], "acc": [0.0, 1.0, 2.0]}
    assert out.meta_info["flag"] is True


def test_concat_keeps_metrics_and_keys_that_only_later_parts_carry():
    a = DataProto.from_dict(tensors={"obs": torch.tensor([1])}, meta_info={"config": "A"})
    b = DataProto.from_dict(tensors={"obs": torch.tensor([2])}, meta_info={"metrics": {"loss": 0.6}, "extra": "B"})
    c = DataProto.from_dict(tensors={"obs": torch.tensor([3])}, meta_info={"metrics": None, "config": "A"})
    out = DataProto.concat([a, b, c])
    assert out.meta_info == {"config": "A", "extra": "B", "metrics": {"loss": [0.6]}}


def test_concat_rejects_conflicting_meta_values_with_verls_message():
    a = DataProto.from_dict(tensors={"obs": torch.tensor([1])}, meta_info={"config": "A"})
    b = DataProto.from_dict(tensors={"obs": torch.tensor([2])}, meta_info={"config": "B"})
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'config'"):
        DataProto.concat([a, b])
    nan_a = DataProto.from_dict(tensors={"obs": torch.tensor([1])}, meta_info={"t": float("nan")})
    nan_b = DataProto.from_dict(tensors={"obs": torch.tensor([2])}, meta_info={"t": float("nan")})
    assert np.isnan(DataProto.concat([nan_a, nan_b]).meta_info["t"])


def test_concat_of_parts_with_different_columns_is_an_assertion():
    a = DataProto.from_dict(tensors={"obs": torch.tensor([1])}, non_tensors={"x": ["a"]})
    b = DataProto.from_dict(tensors={"obs": torch.tensor([2])}, non_tensors={"y": ["b"]})
    with pytest.raises(AssertionError):
        DataProto.concat([a, b])


def test_union_numpy_dict_accepts_equal_arrays_with_nan():
    data = np.random.random(10)
    mixed = np.array([float("nan")] * 9 + ["nan"], dtype=object)
    union_numpy_dict({"a": data, "b": mixed}, {"a": data.copy(), "b": mixed.copy()})
    union_numpy_dict({"x": np.array([1.0, np.nan, 3.0])}, {"x": np.array([1.0, np.nan, 3.0])})
    union_numpy_dict({"n": np.arange(24).reshape(2, 3, 4)}, {"n": np.arange(24).reshape(2, 3, 4)})
    nested = np.array([[np.array([1, 2]), "t"], [np.array([3.0, np.nan]), None]], dtype=object)
    union_numpy_dict({"o": nested}, {"o": nested.copy()})
    for left, right in ((np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 3.0])),
                        (np.array([1.0, np.nan, 3.0]), np.array([np.nan, 1.0, 3.0])),
                        (np.arange(4), np.arange(4) + 1)):
        with pytest.raises(AssertionError, match="not the same object"):
            union_numpy_dict({"x": left}, {"x": right})
    cyc_a, cyc_b = np.array([None], dtype=object), np.array([None], dtype=object)
    cyc_a[0], cyc_b[0] = cyc_a, cyc_b
    union_numpy_dict({"c": cyc_a}, {"c": cyc_b})  # no RecursionError
    with pytest.raises(AssertionError):
        union_numpy_dict({"c": cyc_a}, {"c": np.array([None], dtype=object)})


def test_union_tensor_dict_asserts_equal_values_and_sizes():
    obs = torch.randn(5, 3)
    merged = union_tensor_dict({"obs": obs}, {"obs": obs, "rew": torch.ones(5)})
    assert set(merged) == {"obs", "rew"}
    with pytest.raises(AssertionError):
        union_tensor_dict({"obs": obs}, {"obs": obs + 1})
    with pytest.raises(AssertionError):
        union_tensor_dict({"obs": obs}, {"rew": torch.ones(4)})
    a, b = rows(3), rows(3, {"info": "y"})
    with pytest.raises(AssertionError):  # conflicting meta_info
        a.union(b)


# --------------------------------------------------------------------------------------------- select / pop
def test_select_skips_missing_non_tensor_and_meta_keys_but_not_tensors():
    d = rows(3)
    s = d.select(batch_keys=["obs"], non_tensor_batch_keys=["labels", "absent"], meta_info_keys=["absent"])
    assert list(s.non_tensor_batch) == ["labels"] and s.meta_info == {}
    with pytest.raises(KeyError):
        d.select(batch_keys=["absent"])


def test_pop_of_a_missing_key_is_an_assertion_and_no_batch_works():
    d = DataProto.from_dict(non_tensors={"labels": ["a", "b"]}, meta_info={"1": 1, "2": 2})
    popped = d.pop(non_tensor_batch_keys=["labels"], meta_info_keys=["2"])
    assert list(popped.non_tensor_batch["labels"]) == ["a", "b"] and d.non_tensor_batch == {}
    assert d.meta_info == {"1": 1}
    with pytest.raises(AssertionError):
        d.pop(batch_keys=["absent"])
    assert len(DataProto(batch=None, non_tensor_batch=None, meta_info={"a": 1})) == 0


def test_make_iterator_takes_verls_dataloader_kwargs():
    d = rows(6)
    a = [list(m.non_tensor_batch["labels"]) for m in d.make_iterator(2, 2, seed=1, dataloader_kwargs={"shuffle": True})]
    b = [list(m.non_tensor_batch["labels"]) for m in d.make_iterator(2, 2, seed=1, dataloader_kwargs={"shuffle": True})]
    assert a == b and len(a) == 6 and sorted(sum(a[:3], [])) == list("abcdef")
    assert all(m.meta_info == {"info": "x"} for m in d.make_iterator(3, 1))


# --------------------------------------------------------------------------------------------- serialisation
@pytest.mark.parametrize("tensor", [torch.randn(3, 4, 5), torch.arange(6, dtype=torch.int64).view(2, 3),
                                    torch.randn(4).to(torch.bfloat16), torch.tensor(3.5), torch.zeros(0, 2)])
def test_serialize_single_tensor_round_trips(tensor):
    dtype, shape, raw = serialize_single_tensor(tensor)
    assert dtype == str(tensor.dtype).removeprefix("torch.") and tuple(shape) == tuple(tensor.shape)
    back = deserialize_single_tensor((dtype, shape, raw))
    assert back.dtype == tensor.dtype and back.shape == tensor.shape and torch.equal(back, tensor)
    back.add_(1)  # a writable copy, not a view of the buffer


def test_pickle_and_future_concat():
    d = rows(3)
    e = pickle.loads(pickle.dumps(d))
    assert torch.equal(e.batch["obs"], d.batch["obs"]) and e.meta_info == d.meta_info
    fut = DataProtoFuture.concat([rows(2), rows(1)])
    assert len(fut.get()) == 3


def test_info_and_size_report(capsys):
    d = rows(2, {"metrics": [{"a": 1}], "t": (1, "x")})
    info = d.get_data_info()
    assert "obs: (2, 2) (torch.int64) cpu" in info and "labels: ndarray(2,) (object)" in info
    assert "metrics: list[dict[str: int]]" in info and "t: tuple(int, str)" in info
    d.print_size(prefix="p")
    assert capsys.readouterr().out.startswith("p, Size of tensordict:")


def test_tensordict_round_trip_when_installed():
    pytest.importorskip("tensordict", reason="tensordict is optional (pip install 'tensordict>=0.10')")
    d = DataProto.from_dict(tensors={"obs": torch.arange(3)},
                            non_tensors={"turn_scores": [[], [0.5, 0.8], [0.9]], "msg": [{"a": 1}, {"b": [2]}, {}]},
                            meta_info={"name": "abc"})
    td = d.to_tensordict()
    assert torch.equal(td["obs"], torch.arange(3)) and td["name"] == "abc"
    back = DataProto.from_tensordict(td)
    assert back.non_tensor_batch["turn_scores"].tolist() == [[], [0.5, 0.8], [0.9]]
    assert back.non_tensor_batch["msg"].tolist() == [{"a": 1}, {"b": [2]}, {}] and back.meta_info == {"name": "abc"}
    assert DataProto(batch=td.select("obs")).batch["obs"].tolist() == [0, 1, 2]


def test_tensordict_missing_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensordict", None)  # import fails as if not installed
    with pytest.raises(ModuleNotFoundError, match="pip install 'tensordict>=0.10'"):
        rows(2).to_tensordict()


def test_a_batch_without_tensors_keeps_its_row_count_through_pickling():
    empty = DataProto(batch=TensorBatch(batch_size=10))
    back = pickle.loads(pickle.dumps(empty))
    assert len(back) == 10 and back.batch.batch_size == torch.Size([10]) and not back.batch
    td = pytest.importorskip("tensordict", reason="tensordict is optional (pip install 'hybridflow[tensordict]')")
    from_td = pickle.loads(pickle.dumps(DataProto(batch=td.TensorDict({}, batch_size=[10]))))
    assert len(from_td) == 10 and list(from_td.batch.keys()) == []


def test_tensordict_serialisation_round_trips_every_dtype_and_nested_tensors():
    td = pytest.importorskip("tensordict", reason="tensordict is optional (pip install 'hybridflow[tensordict]')")
    from hybridflow.protocol import deserialize_tensordict, serialize_tensordict

    g = torch.Generator().manual_seed(0)
    source = {"f32": torch.randn(2, 3, generator=g), "bf16": torch.randn(2, 3, generator=g).bfloat16(),
              "i64": torch.arange(6).view(2, 3), "flag": torch.tensor([[True, False], [False, True]]),
              "fp8": torch.randn(2, 3, generator=g).to(torch.float8_e4m3fn),
              "nested": torch.nested.as_nested_tensor([torch.randn(2, 3, generator=g), torch.randn(3, 4, generator=g)])}
    original = td.TensorDict(source, batch_size=(2,), device="cpu")
    size, device, items = serialize_tensordict(original)
    assert size == (2,) and device == "cpu" and len(items["nested"]) == 2 and len(items["f32"]) == 3
    back = deserialize_tensordict((size, device, items))
    assert back.batch_size == original.batch_size and str(back.device) == "cpu" and set(back.keys()) == set(source)
    for key, value in source.items():
        if value.is_nested:
            assert back[key].is_nested and back[key].layout == value.layout
            assert all(torch.equal(a, b) for a, b in zip(value.unbind(), back[key].unbind(), strict=True))
        else:  # bit for bit, dtype and shape kept (fp8 compared through its bytes)
            assert back[key].dtype == value.dtype and back[key].shape == value.shape
            assert torch.equal(back[key].view(torch.uint8), value.contiguous().view(torch.uint8))
    two_dims = td.TensorDict({"x": torch.zeros(5, 3, 4)}, batch_size=(5, 3))
    assert deserialize_tensordict(serialize_tensordict(two_dims)).batch_size == torch.Size([5, 3])


def test_verls_get_tensordict_feeds_from_tensordict():
    pytest.importorskip("tensordict", reason="tensordict is optional (pip install 'hybridflow[tensordict]')")
    from hybridflow.utils.tensordict_utils import get_tensordict

    built = get_tensordict({"obs": torch.arange(4), "labels": list("abcd"), "turn_scores": [[], [0.5], [0.8, 0.9], []],
                            "info": [{"acc": 1.0}, {}, {"acc": 0.0}, {"x": [1]}]}, {"name": "run"})
    data = DataProto.from_tensordict(built)
    assert data.batch["obs"].tolist() == [0, 1, 2, 3] and data.meta_info == {"name": "run"}
    assert data.non_tensor_batch["labels"].tolist() == list("abcd")
    assert data.non_tensor_batch["turn_scores"].tolist() == [[], [0.5], [0.8, 0.9], []]
    assert data.non_tensor_batch["info"].tolist() == [{"acc": 1.0}, {}, {"acc": 0.0}, {"x": [1]}]
    with pytest.raises(ValueError, match="different lengths"):
        get_tensordict({"obs": torch.arange(4), "labels": list("abc")})
