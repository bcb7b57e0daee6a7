"""Fixtures for the data tests: a verl-shaped ``data`` config and a tokenizer from the BPE checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest


@dataclass
class DataCfg:
    """The attributes of verl's ``data`` section that the dataset and loaders read."""

    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 64
    truncation: str = "error"
    max_row_bytes: int = 16 * 2**20
    filter_overlong_prompts: bool = False
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    return_full_prompt: bool = False
    image_key: str = "images"
    video_key: str = "videos"
    return_multi_modal_inputs: bool = True
    train_max_samples: int = -1
    val_max_samples: int = -1
    train_batch_size: int = 4
    gen_batch_size: int | None = None
    val_batch_size: int | None = None
    shuffle: bool = True
    validation_shuffle: bool = False
    seed: int | None = 7
    dataloader_num_workers: int = 0
    custom_cls: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(path=None, name=None))
    sampler: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(class_path=None, class_name=None))


@pytest.fixture
def data_cfg():
    return DataCfg()


@pytest.fixture(scope="session")
def bpe_tokenizer(bpe_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_model_dir)


@pytest.fixture
def verl_row():
    """Builds one verl-format row (``verl_row(i, content, **extra_columns)``)."""
    return _verl_row


def _verl_row(i: int, content: str, **extra) -> dict:
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i, "tools_kwargs": {"calc": {"x": i}},
                       "interaction_kwargs": {"name": "gsm8k"}},
        **extra,
    }
