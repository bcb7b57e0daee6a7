"""A seeded, resumable sampler and dataloader (the part of ``torchdata.StatefulDataLoader`` we need).

Resuming RL training must continue with exactly the prompts that would have come next, including in the
middle of an epoch, or a resumed run silently sees some prompts twice and others never. verl relies on
``torchdata.stateful_dataloader``; torchdata is not installed here (and its stateful loader pins torch
versions), and the need is small: with a deterministic order the whole state is ``(epoch, batches consumed
in this epoch)``. Epoch ``e`` is a permutation drawn from ``torch.Generator().manual_seed(seed + e)``, so the
order of any epoch can be rebuilt from the seed alone, and the loader skips the consumed batches on resume
without touching the dataset. Worker processes (``dataloader_num_workers``) are fine: the position counts
batches *handed to the caller*, not batches prefetched.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class ResumableSampler(Sampler[int]):
    """Indices of epoch ``epoch``: a seeded permutation (``shuffle``) or ``0..n-1``."""

    def __init__(self, num_samples: int, shuffle: bool, seed: int):
        if num_samples <= 0:
            raise ValueError("cannot sample from an empty dataset")
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=gen).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.order(self.epoch))

    def __len__(self) -> int:
        return self.num_samples


class ExternalSampler(ResumableSampler):
    """Adapts a user sampler (``data.sampler.class_path``) to the epoch-order interface.

    The order of epoch ``e`` is whatever the user sampler yields after ``set_epoch(e)`` (when it has one);
    resuming is exact only if that order is deterministic, which is the user sampler's contract.
    """

    def __init__(self, sampler: Sampler[int], num_samples: int):
        super().__init__(num_samples, shuffle=False, seed=0)
        self.inner = sampler

    def order(self, epoch: int) -> list[int]:
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)
        return list(iter(self.inner))


def create_rl_sampler(data_config, dataset: Dataset) -> ResumableSampler:
    """Sampler for the training set: shuffled with ``data.seed`` (1 when null, as verl) if ``data.shuffle``.

    A user sampler class from ``data.sampler.{class_path,class_name}`` is used instead when set.
    """
    from hybridflow.data.custom_classes import custom_sampler

    user = custom_sampler(data_config, dataset)
    if user is not None:
        return ExternalSampler(user, len(dataset))
    seed = data_config.seed if data_config.seed is not None else 1
    return ResumableSampler(len(dataset), shuffle=bool(data_config.shuffle), seed=seed)


class _SkipBatchSampler(Sampler[list[int]]):
    def __init__(self, order: list[int], batch_size: int, drop_last: bool, skip: int):
        self.batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        if drop_last and self.batches and len(self.batches[-1]) < batch_size:
            self.batches.pop()
        self.batches = self.batches[skip:]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class StatefulDataLoader:
    """Batches over a :class:`ResumableSampler` with ``state_dict()`` / ``load_state_dict()``.

    Each ``iter()`` runs the rest of the current epoch; when it is exhausted the epoch advances, so
    ``for epoch in range(E): for batch in loader: ...`` sees a fresh permutation per epoch, and a state
    saved at any point (also right after the last batch of an epoch) resumes at the very next batch.
    """

    def __init__(self, dataset: Dataset, batch_size: int, sampler: ResumableSampler,
                 collate_fn: Callable[[list], Any], drop_last: bool = True, num_workers: int = 0):
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.collate_fn = collate_fn
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.consumed = 0  # batches of the current epoch already handed out
        if len(self) == 0:
            raise ValueError(
                f"batch size {batch_size} is larger than the dataset ({len(sampler)} rows) with drop_last=True: "
                "no batch can be formed; lower data.train_batch_size or add data"
            )

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        if self.consumed >= len(self):
            self._next_epoch()
        batches = _SkipBatchSampler(self.sampler.order(self.sampler.epoch), self.batch_size, self.drop_last,
                                    self.consumed)
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collate_fn,
                            num_workers=self.num_workers)
        for batch in loader:
            self.consumed += 1
            yield batch
        self._next_epoch()

    def _next_epoch(self) -> None:
        self.sampler.set_epoch(self.sampler.epoch + 1)
        self.consumed = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch, "consumed": self.consumed, "seed": self.sampler.seed,
                "num_samples": len(self.sampler), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key in ("seed", "num_samples", "batch_size"):
            mine = self.state_dict()[key]
            if state[key] != mine:
                raise ValueError(
                    f"dataloader checkpoint was saved with {key}={state[key]} but this run has {key}={mine}; "
                    "resume with the same data files, data.seed and batch size (or start a fresh run)"
                )
        self.sampler.set_epoch(int(state["epoch"]))
        self.consumed = int(state["consumed"])
