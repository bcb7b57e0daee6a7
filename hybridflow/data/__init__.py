"""Data: the RL prompt dataset, collate, the resumable sampler/dataloader, synthetic tasks, preprocessors."""

from hybridflow.data.collate import collate_fn
from hybridflow.data.io import DataFileError, read_rows, write_parquet
from hybridflow.data.loaders import create_train_dataloader, create_val_dataloader
from hybridflow.data.prompts import PromptTooLongError
from hybridflow.data.rl_dataset import RLHFDataset, create_rl_dataset
from hybridflow.data.resumable_sampler import ResumableSampler, StatefulDataLoader, create_rl_sampler
from hybridflow.data.synthetic import SYNTHETIC_TASKS, make_rows, write_synthetic

__all__ = [
    "RLHFDataset", "create_rl_dataset", "collate_fn", "create_rl_sampler", "ResumableSampler",
    "StatefulDataLoader", "create_train_dataloader", "create_val_dataloader", "DataFileError",
    "PromptTooLongError", "read_rows", "write_parquet", "SYNTHETIC_TASKS", "make_rows", "write_synthetic",
]
