"""Errors that say where (issue 24): each case that used to end in a raw traceback, a crash or a silent run now
fails with the file, row or key and the fix -- or, for a huge reward, trains on with the value clipped and
counted. (Truncated checkpoints and a full disk: test_resume_safety.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from .conftest import A, base_args, invoke_cli, read_metrics

REWARDS = Path(__file__).with_name("faulty_rewards.py")


def _run(tmp_path, model, train, extra=(), steps=1):
    return invoke_cli(base_args(model, train, tmp_path, steps=steps, extra=list(extra)), tmp_path)


@pytest.mark.parametrize("override, needle", [
    ("data.max_response_length=0", "data.max_response_length=0 is out of range"),
    (f"{A}.actor.clip_ratio=-0.2", f"{A}.actor.clip_ratio=-0.2 is out of range"),
    (f"{A}.actor.ppo_epochs=0", f"{A}.actor.ppo_epochs=0 is out of range"),
    ("reward_model.error_score=nan", "reward_model.error_score=nan is out of range"),
    ("reward_model.worker_memory_mb=10", "reward_model.worker_memory_mb=10 is out of range"),
    ("data.max_row_bytes=0", "data.max_row_bytes=0 is out of range"),
])
def test_out_of_range_values_are_refused_at_config_time(override, needle, tmp_path, fault_data):
    """Refused before anything loads: the model path does not even exist here."""
    result = _run(tmp_path, tmp_path / "no_such_model", fault_data / "train.parquet", [override])
    assert result.rc == 2 and result.escaped is None, result.message
    assert needle in result.stderr and "no_such_model" not in result.stderr


def test_a_corrupt_safetensors_file_is_named(tmp_path, fault_data, nano_model_dir):
    model = tmp_path / "model"
    shutil.copytree(nano_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = _run(tmp_path, model, fault_data / "train.parquet")
    assert result.rc == 2 and result.escaped is None, result.message
    assert f"weight file {weights}" in result.stderr and "corrupt or truncated" in result.stderr


def test_a_model_folder_without_tokenizer_files_is_refused(tmp_path, fault_data, nano_model_dir):
    model = tmp_path / "model"
    shutil.copytree(nano_model_dir, model)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model / name).unlink(missing_ok=True)
    result = _run(tmp_path, model, fault_data / "train.parquet")
    assert result.rc == 2 and result.escaped is None, result.message
    assert f"{model}' has no tokenizer" in result.stderr and "tokenizer_path" in result.stderr


def test_a_lone_surrogate_in_a_jsonl_row_is_named(tmp_path, fault_data, nano_model_dir):
    rows = pd.read_parquet(fault_data / "train.parquet").to_dict("records")
    path = tmp_path / "train.jsonl"
    with path.open("w") as f:
        for i, row in enumerate(rows):
            row["prompt"] = [dict(m) for m in row["prompt"]]
            row["reward_model"] = dict(row["reward_model"])
            row["extra_info"] = {k: (int(v) if hasattr(v, "item") else v) for k, v in dict(row["extra_info"]).items()}
            line = json.dumps(row)
            if i == 3:  # a JSON escape of half an emoji (a cut "\ud83d\ude00")
                line = line.replace('"content": "', '"content": "\\ud83d', 1)
            f.write(line + "\n")
    result = _run(tmp_path, nano_model_dir, path)
    assert result.rc == 2 and result.escaped is None, result.message
    assert str(path) in result.stderr and "row 3" in result.stderr and "lone surrogate" in result.stderr


def test_bytes_prompt_content_is_refused_with_the_row(tmp_path, fault_data, nano_model_dir):
    """A binary parquet column (one row of bytes makes pyarrow store the whole column as binary)."""
    df = pd.read_parquet(fault_data / "train.parquet")
    df["prompt"] = [[{"role": m["role"], "content": m["content"].encode()} for m in p] for p in df["prompt"]]
    path = tmp_path / "bytes.parquet"
    df.to_parquet(path)
    result = _run(tmp_path, nano_model_dir, path)
    assert result.rc == 2 and result.escaped is None, result.message
    assert f"row 0 of '{path}'" in result.stderr and "content is bytes" in result.stderr


def test_a_reward_of_1e300_is_clipped_and_counted(tmp_path, fault_data, nano_model_dir):
    """Issue 24: it crashed the run (float32 overflow in the advantage computation)."""
    result = _run(tmp_path, nano_model_dir, fault_data / "train.parquet",
                  [f"custom_reward_function.path={REWARDS}", "custom_reward_function.name=returns_huge"], steps=2)
    assert result.escaped is None and result.rc == 0, result.message
    steps = [m for m in read_metrics(tmp_path) if "timing_s/step" in m]
    assert len(steps) == 2
    for step in steps:
        assert step["reward/clipped_count"] == 8.0  # 4 prompts x 2 samples, every one beyond 1e6
        assert abs(step["critic/score/max"]) <= 1e6 and abs(step["critic/score/min"]) <= 1e6
        assert all(v == v for k, v in step.items() if isinstance(v, float) and k.startswith("actor/"))  # no NaN
