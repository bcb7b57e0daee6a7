"""Train / validation dataloaders built from the ``data`` config (verl's batch-size semantics)."""

from __future__ import annotations

from hybridflow.data.collate import collate_fn
from hybridflow.data.resumable_sampler import ResumableSampler, StatefulDataLoader, create_rl_sampler


def create_train_dataloader(dataset, data_config) -> StatefulDataLoader:
    """Shuffled (``data.shuffle``, ``data.seed``), resumable, ``drop_last`` so every step has a full batch.

    The batch size is ``data.gen_batch_size`` when set (DAPO dynamic sampling generates more prompts than it
    trains on), else ``data.train_batch_size``; both count prompts.
    """
    batch_size = data_config.gen_batch_size or data_config.train_batch_size
    return StatefulDataLoader(dataset, batch_size=batch_size, sampler=create_rl_sampler(data_config, dataset),
                              collate_fn=collate_fn, drop_last=True,
                              num_workers=data_config.dataloader_num_workers)


def create_val_dataloader(dataset, data_config) -> StatefulDataLoader:
    """In-order validation batches of ``data.val_batch_size`` (null = the whole set in one batch)."""
    batch_size = data_config.val_batch_size or len(dataset)
    sampler = ResumableSampler(len(dataset), shuffle=bool(data_config.validation_shuffle),
                               seed=data_config.seed if data_config.seed is not None else 1)
    return StatefulDataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
                              drop_last=False, num_workers=0)
