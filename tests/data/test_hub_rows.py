"""data/io.read_hub_rows: the one loader of hub datasets, behind both a run's data files (``owner/name:split``) and
the preprocessors (``hybridflow data gsm8k`` without ``--input``).  No network here (``HF_HUB_OFFLINE``): a local
folder stands in for a hub repository, and a missing dataset shows the error each caller gives."""

from __future__ import annotations

import json

import pytest

from hybridflow.data.io import DataFileError, read_hub_rows, read_rows


def test_the_split_of_a_dataset_repository_comes_back_as_dicts(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # not the user's cache
    for split, rows in {"train": [{"q": "1+1", "a": 2}], "test": [{"q": "2+2", "a": 4}, {"q": "3+3", "a": 6}]}.items():
        (tmp_path / "repo").mkdir(exist_ok=True)
        (tmp_path / "repo" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_hub_rows(str(tmp_path / "repo"), "test") == [{"q": "2+2", "a": 4}, {"q": "3+3", "a": 6}]


def test_a_run_data_file_that_is_no_local_file_nor_hub_dataset_says_both():
    with pytest.raises(DataFileError) as info:
        read_rows("hybridflow-tests/no-such-dataset:test")
    message = str(info.value)
    assert "could not load hub dataset 'hybridflow-tests/no-such-dataset' split 'test'" in message
    assert "pass a local .parquet/.json/.jsonl path" in message


def test_a_preprocessor_without_input_names_the_dataset_its_configuration_and_the_flag():
    from hybridflow.data.preprocess import gsm8k

    with pytest.raises(DataFileError) as info:
        gsm8k.main(["--local-dir", "/nonexistent-never-written"])
    message = str(info.value)
    assert "'openai/gsm8k' (configuration 'main') split 'train'" in message and "--input DIR" in message
