"""Resumable seeded sampler / dataloader: exact resume mid-epoch and across an epoch boundary."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset

from hybridflow.data import ResumableSampler, StatefulDataLoader, create_rl_sampler, create_train_dataloader
from hybridflow.data.loaders import create_val_dataloader


class Numbers(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


class Rows(Numbers):
    def __getitem__(self, i):
        return {"x": torch.tensor(i), "tag": f"row{i}"}


def ids(batch):
    return batch.tolist()


def make_loader(n=10, batch_size=3, seed=5, shuffle=True, num_workers=0):
    sampler = ResumableSampler(n, shuffle=shuffle, seed=seed)
    return StatefulDataLoader(Numbers(n), batch_size, sampler, collate_fn=torch.tensor, drop_last=True,
                              num_workers=num_workers)


def run_epochs(loader, epochs):
    return [[ids(b) for b in loader] for _ in range(epochs)]


def test_epoch_orders_are_seeded_permutations():
    loader = make_loader()
    e0, e1 = run_epochs(loader, 2)
    assert len(e0) == 3 and all(len(b) == 3 for b in e0)  # 10 // 3 with drop_last
    order0 = torch.randperm(10, generator=torch.Generator().manual_seed(5)).tolist()
    assert sum(e0, []) == order0[:9]
    order1 = torch.randperm(10, generator=torch.Generator().manual_seed(6)).tolist()
    assert sum(e1, []) == order1[:9]
    assert run_epochs(make_loader(), 2) == [e0, e1]  # same seed, same stream
    assert run_epochs(make_loader(seed=6), 1)[0] != e0


def test_no_shuffle_is_in_order():
    assert run_epochs(make_loader(shuffle=False), 1)[0] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def _stream(loader, n_batches):
    out = []
    while len(out) < n_batches:
        for b in loader:
            out.append(ids(b))
            if len(out) == n_batches:
                break
    return out


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4, 7])  # mid-epoch, exactly at the boundary, later epochs
def test_resume_is_exact(stop_after):
    reference = _stream(make_loader(), 9)
    first = make_loader()
    got = _stream(first, stop_after)
    state = first.state_dict()
    resumed = make_loader()
    resumed.load_state_dict(state)
    got += _stream(resumed, 9 - stop_after)
    assert got == reference


def test_resume_with_worker_processes():
    reference = _stream(make_loader(), 5)
    first = make_loader(num_workers=1)
    got = _stream(first, 2)
    resumed = make_loader(num_workers=1)
    resumed.load_state_dict(first.state_dict())
    assert got + _stream(resumed, 3) == reference


def test_state_mismatch_is_refused():
    state = make_loader().state_dict()
    with pytest.raises(ValueError, match="saved with seed=5 but this run has seed=9"):
        make_loader(seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples=10 but this run has num_samples=12"):
        make_loader(n=12).load_state_dict(state)


def test_batch_larger_than_dataset():
    with pytest.raises(ValueError, match="batch size 20 is larger than the dataset"):
        make_loader(batch_size=20)


def test_config_driven_loaders(data_cfg):
    data_cfg.seed = None
    sampler = create_rl_sampler(data_cfg, Numbers(8))
    assert sampler.seed == 1 and sampler.shuffle
    data_cfg.gen_batch_size = 2
    train = create_train_dataloader(Rows(8), data_cfg)
    assert len(train) == 4
    assert sorted(sum((b["x"].tolist() for b in train), [])) == list(range(8))
    (val,) = list(create_val_dataloader(Rows(5), data_cfg))
    assert val["x"].tolist() == [0, 1, 2, 3, 4] and list(val["tag"]) == [f"row{i}" for i in range(5)]


def test_user_sampler_class(tmp_path, data_cfg):
    (tmp_path / "my_sampler.py").write_text(
        "from torch.utils.data import Sampler\n"
        "class Reverse(Sampler):\n"
        "    def __init__(self, data_source, data_config):\n"
        "        self.n = len(data_source)\n"
        "    def __iter__(self):\n"
        "        return iter(range(self.n - 1, -1, -1))\n"
        "    def __len__(self):\n"
        "        return self.n\n"
    )
    data_cfg.sampler.class_path, data_cfg.sampler.class_name = str(tmp_path / "my_sampler.py"), "Reverse"
    data_cfg.train_batch_size = data_cfg.gen_batch_size = 2
    loader = create_train_dataloader(Rows(4), data_cfg)
    assert [b["x"].tolist() for b in loader] == [[3, 2], [1, 0]]
    data_cfg.sampler.class_name = "Forward"
    with pytest.raises(AttributeError, match=r"data.sampler.class_path='.*my_sampler.py' has no attribute 'Forward' "
                                             r"\(the class\); defined there: Reverse"):
        create_train_dataloader(Rows(4), data_cfg)
