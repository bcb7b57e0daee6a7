"""The quickstart pipeline end to end at toy scale: warm-up SFT, GRPO through the framework, summary + report.

The real demo (minutes, accuracy gain) is measured by hand and reported in the module docstring; this checks
the plumbing and the pieces the headline number depends on (task format, scorer, held-out split).
"""

from __future__ import annotations

import json
import random

import pytest


def test_addition_fixed_pads_every_answer_to_three_digits():
    from hybridflow.data.synthetic import SYNTHETIC_TASKS, make_rows

    task = SYNTHETIC_TASKS.get("addition_fixed")
    assert task.data_source == "synthetic/addition_fixed"
    rows = make_rows("addition_fixed", 50, seed=3, split="train")
    for row in rows:
        prompt, answer = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        a, b = int(prompt[:2]), int(prompt[3:5])
        assert len(prompt) == 6 and prompt[2] == "+" and prompt[5] == "="
        assert len(answer) == 3 and int(answer) == a + b
    # hand-checked cases of the generator itself
    rng = random.Random(0)
    rng_copy = random.Random(0)
    a, b = rng_copy.randint(0, 99), rng_copy.randint(0, 99)
    assert task.example(rng) == (f"{a:02d}+{b:02d}=", f"{a + b:03d}")


def test_synthetic_compute_score_golden_values():
    from hybridflow.rewards.scorers.synthetic import compute_score

    assert compute_score("synthetic/addition_fixed", "052", "052") == 1.0
    assert compute_score("synthetic/addition_fixed", "52", "052") == 0.0  # width is part of the answer
    assert compute_score("synthetic/addition_fixed", " 052\n", "052") == 1.0
    assert compute_score("synthetic/countdown", "3*4+2", "target:14;numbers:3,4,2") == 1.0
    assert compute_score("synthetic/countdown", "3+4+2", "target:14;numbers:3,4,2") == 0.0
    with pytest.raises(ValueError, match="synthetic/<task>"):
        compute_score("openai/gsm8k", "1", "1")


def test_held_out_rows_are_disjoint_and_unique():
    from hybridflow.trainer.quickstart import held_out_rows

    train, test = held_out_rows(train_size=3000, test_size=300, seed=1)
    test_prompts = [r["prompt"][0]["content"] for r in test]
    assert len(test_prompts) == 300 == len(set(test_prompts))
    assert not _overlap(train, set(test_prompts))
    assert 2500 < len(train) <= 3000  # only the few colliding prompts are removed


def test_prompts_overlap_helper_detects_overlap():
    rows = [{"prompt": [{"content": "01+02="}]}]
    assert _overlap(rows, {"01+02="}) and not _overlap(rows, {"01+03="})


def _overlap(rows: list[dict], prompts: set[str]) -> bool:
    return any(r["prompt"][0]["content"] in prompts for r in rows)


@pytest.mark.slow
def test_quickstart_writes_summary_metrics_and_report(tmp_path, capsys):
    from hybridflow.trainer.quickstart import run_quickstart

    summary = run_quickstart(str(tmp_path), sft_steps=3, rl_steps=2, train_size=300, test_size=16)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["steps"] == 2 == summary["steps"]
    assert 0.0 <= on_disk["before"]["accuracy"] <= 1.0 and 0.0 <= on_disk["after"]["accuracy"] <= 1.0
    assert on_disk["before"]["step"] == 0 and on_disk["after"]["step"] == 2
    assert on_disk["seconds"] > 0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any("critic/score/mean" in rec for rec in lines)
    assert "<html" in (tmp_path / "report.html").read_text().lower()
    out = capsys.readouterr().out
    assert "[grpo] step   2/2" in out and "held-out accuracy" in out
