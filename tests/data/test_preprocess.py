"""Preprocessors: GSM8K on the real jsonl, MATH on local files, countdown generation, the CLI table."""

from __future__ import annotations

import argparse
import json

import pytest

from hybridflow.data import DataFileError, read_rows
from hybridflow.data.preprocess import DATA_COMMANDS, preprocess_countdown, preprocess_gsm8k, preprocess_math
from hybridflow.data.preprocess.gsm8k import INSTRUCTION, main as gsm8k_main
from hybridflow.rewards import default_compute_score


def _line_count(path) -> int:
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


@pytest.fixture(scope="module", params=["gsm8k_dir", "gsm8k_full_dir"], ids=["sample", "full"])
def gsm8k_input(request):
    """The repository's sample, and the whole dataset where the machine has it (skipped otherwise)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="module")
def gsm8k_parquet(gsm8k_input, tmp_path_factory):
    return preprocess_gsm8k(gsm8k_input, str(tmp_path_factory.mktemp("gsm8k")))


def test_gsm8k_rows(gsm8k_parquet, gsm8k_input):
    train, test = read_rows(gsm8k_parquet["train"]), read_rows(gsm8k_parquet["test"])
    assert (len(train), len(test)) == (_line_count(f"{gsm8k_input}/train.jsonl"), _line_count(f"{gsm8k_input}/test.jsonl"))
    row = train[0]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith(" " + INSTRUCTION)
    assert row["reward_model"] == {"style": "rule", "ground_truth": "72"}
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    assert row["extra_info"]["answer"].endswith("#### 72")
    assert row["extra_info"]["question"].startswith("Natalia sold clips")
    assert test[5]["extra_info"] == {**test[5]["extra_info"], "split": "test", "index": 5}


def test_full_gsm8k_has_every_row(gsm8k_full_dir):
    assert (_line_count(f"{gsm8k_full_dir}/train.jsonl"), _line_count(f"{gsm8k_full_dir}/test.jsonl")) == (7473, 1319)


def test_the_sample_is_the_head_of_gsm8k(gsm8k_dir, gsm8k_full_dir):
    """The repository's rows are GSM8K's own first rows, unchanged (tests/data/fixtures/gsm8k_sample/README.md)."""
    for split in ("train", "test"):
        with open(f"{gsm8k_dir}/{split}.jsonl", "rb") as fh:
            sample = fh.read()
        with open(f"{gsm8k_full_dir}/{split}.jsonl", "rb") as fh:
            assert fh.read(len(sample)) == sample


def test_gsm8k_ground_truths_score_one(gsm8k_parquet):
    for split in ("train", "test"):
        for row in read_rows(gsm8k_parquet[split]):
            gt = row["reward_model"]["ground_truth"]
            assert "," not in gt
            assert default_compute_score(row["data_source"], f"so the result is\n#### {gt}", gt) == 1.0


def test_gsm8k_cli_main_and_bad_input(gsm8k_dir, tmp_path, capsys):
    paths = gsm8k_main(["--input", gsm8k_dir, "--local-dir", str(tmp_path / "ok")])
    assert paths["test"] == str(tmp_path / "ok" / "test.parquet") and "test: " in capsys.readouterr().out
    with pytest.raises(DataFileError, match="no train file in .*expected train.jsonl"):
        gsm8k_main(["--input", str(tmp_path), "--local-dir", str(tmp_path / "out")])


def test_math_local_jsonl(tmp_path):
    rows = [
        {"problem": "What is $1/2 + 1/4$?", "solution": "We add: $\\boxed{\\frac{3}{4}}$.", "level": "Level 1",
         "type": "Algebra"},
        {"problem": "Compute $2^3$.", "solution": "It is $\\boxed{8}$.", "level": "Level 1", "type": "Algebra"},
    ]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    paths = preprocess_math(str(tmp_path), str(tmp_path / "out"))
    out = read_rows(paths["train"])
    assert [r["reward_model"]["ground_truth"] for r in out] == ["\\frac{3}{4}", "8"]
    assert out[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert out[0]["prompt"][0]["content"].endswith("within \\boxed{}.")
    gt = out[0]["reward_model"]["ground_truth"]
    assert default_compute_score(out[0]["data_source"], "so \\boxed{0.75}", gt) == 1.0


def test_countdown_generated_and_solvable(tmp_path):
    paths = preprocess_countdown(None, str(tmp_path), train_size=50, test_size=10, seed=3)
    rows = read_rows(paths["train"])
    assert len(rows) == 50 and len(read_rows(paths["test"])) == 10
    again = read_rows(preprocess_countdown(None, str(tmp_path / "b"), train_size=50, test_size=10, seed=3)["train"])
    assert rows == again
    row = rows[0]
    assert row["data_source"] == "countdown" and row["reward_model"]["ground_truth"] == {
        "target": row["target"], "numbers": row["nums"]}
    with pytest.raises(ValueError, match="generated locally"):
        preprocess_countdown("/somewhere", str(tmp_path))


def test_data_commands_table(tmp_path):
    assert set(DATA_COMMANDS) == {"gsm8k", "math", "countdown", "synthetic", "geo3k", "vision"}
    description, setup, run = DATA_COMMANDS["synthetic"]
    parser = argparse.ArgumentParser()
    setup(parser)
    args = parser.parse_args(["--task", "sort", "--local-dir", str(tmp_path), "--train-size", "8", "--test-size", "4"])
    paths = run(args)
    assert "synthetic" in description.lower()
    assert len(read_rows(paths["train"])) == 8 and read_rows(paths["test"])[0]["data_source"] == "synthetic/sort"
