"""Synthetic tasks: deterministic rows, short prompts, answers their own scorers accept."""

from __future__ import annotations

import pytest

from hybridflow.data import SYNTHETIC_TASKS, make_rows, write_synthetic
from hybridflow.data.io import read_rows
from hybridflow.rewards import default_compute_score
from hybridflow.rewards.scorers.synthetic import parse_countdown_ground_truth


def test_addition_rows_golden():
    rows = make_rows("addition", 3, seed=0, split="train")
    for row in rows:
        text = row["prompt"][0]["content"]
        a, b = text.rstrip("=").split("+")
        assert len(text) == 6 and row["reward_model"]["ground_truth"] == str(int(a) + int(b))
    assert rows[0]["data_source"] == "synthetic/addition"
    assert rows == make_rows("addition", 3, seed=0, split="train")
    assert rows != make_rows("addition", 3, seed=0, split="test")


@pytest.mark.parametrize("task", ["addition", "reverse", "sort", "countdown", "multiplication"])
def test_prompts_short_and_references_score_one(task):
    for row in make_rows(task, 50, seed=1, split="train"):
        content, gt = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        assert len(content) <= 32
        if task == "countdown":
            target, nums = parse_countdown_ground_truth(gt)
            answer = _solve(target, nums)
        else:
            answer = gt
        assert len(answer) <= 8
        assert default_compute_score(row["data_source"], f" {answer}\n", gt) == 1.0
        assert default_compute_score(row["data_source"], answer + "0", gt) == 0.0


def _solve(target, nums):
    import itertools

    for a, b, c in itertools.permutations(nums):
        for o1, o2 in itertools.product("+-*", repeat=2):
            expr = f"{a}{o1}{b}{o2}{c}"
            if default_compute_score("synthetic/countdown", expr, f"target:{target};numbers:{a},{b},{c}") == 1.0:
                return expr
    raise AssertionError(f"no solution for {target} from {nums}")


def test_multiplication_rows_and_final_answer_scoring():
    """3-digit x 2-digit, 5-digit products; the last line of a multi-turn response is the answer, never a tool result."""
    from hybridflow.rewards.scorers.synthetic import compute_score

    for row in make_rows("multiplication", 50, seed=0, split="train"):
        a, b = row["prompt"][0]["content"].split("*")
        assert len(a) == 3 and len(b) == 2 and row["reward_model"]["ground_truth"] == str(int(a) * int(b))
        assert len(row["reward_model"]["ground_truth"]) == 5
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"123*45"}}</tool_call>'
    observation = "\nuser\n<tool_response>5535</tool_response>\nassistant\n"
    for score in (default_compute_score, compute_score):  # built-in scorer and the verl custom-function file
        assert score("synthetic/multiplication", call + observation + "5535", "5535") == 1.0
        assert score("synthetic/multiplication", "5535\n", "5535") == 1.0  # a direct answer
        assert score("synthetic/multiplication", call + observation, "5535") == 0.0  # no answer of its own
        assert score("synthetic/multiplication", call + observation + "5536", "5535") == 0.0
        assert score("synthetic/multiplication", "5535 ", "55") == 0.0


def test_reverse_and_sort_golden():
    assert default_compute_score("synthetic/reverse", "3140", "3140") == 1.0
    row = make_rows("sort", 1, seed=0, split="train")[0]
    digits = row["prompt"][0]["content"].split()[1].rstrip(":")
    assert row["reward_model"]["ground_truth"] == "".join(sorted(digits))


def test_write_synthetic_and_all_tasks_share_a_file(tmp_path):
    paths = write_synthetic("reverse", str(tmp_path), train_size=10, test_size=5, seed=0)
    assert len(read_rows(paths["train"])) == 10
    from hybridflow.data import write_parquet

    mixed = sum((make_rows(t, 2, 0, "train") for t in SYNTHETIC_TASKS.names()), [])
    assert len(read_rows(write_parquet(mixed, str(tmp_path / "mix.parquet")))) == 2 * len(SYNTHETIC_TASKS)
    with pytest.raises(KeyError, match="Unknown synthetic task 'adition'. Did you mean 'addition'"):
        make_rows("adition", 2, 0, "train")


@pytest.mark.parametrize("task", ["addition", "reverse", "sort", "countdown"])
def test_char_tokenizer_prompts_fit_a_small_window(task, tmp_path, data_cfg):
    """The quickstart uses the char tokenizer: every templated prompt must fit max_prompt_length=40."""
    from hybridflow.data import RLHFDataset
    from hybridflow.utils.tiny_model import build_char_tokenizer

    tok = build_char_tokenizer()
    paths = write_synthetic(task, str(tmp_path), train_size=64, test_size=8, seed=0)
    data_cfg.max_prompt_length = 40
    ds = RLHFDataset(paths["train"], tok, data_cfg)
    lengths = [int(ds[i]["attention_mask"].sum()) for i in range(len(ds))]
    assert max(lengths) <= 40
    assert tok.decode(ds[0]["raw_prompt_ids"]).endswith("<|im_start|>assistant\n")
