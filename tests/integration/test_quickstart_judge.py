"""``hybridflow quickstart --task judge`` (RLAIF on CPU): the judge's training data, how it is asked, and the
agreement floor that stops the run before RL.  No end-to-end learning test yet: the judge needs ~2500 SFT steps to
clear the floor (~4 minutes of CPU for the whole demo); a reduced run with an 800-step judge stops at the floor
(85 % agreement), which is this file's last test at toy scale.
"""

from __future__ import annotations

import json
import random

import pytest


def test_the_judge_is_asked_in_two_turns_and_its_verdict_parsed():
    from hybridflow.quickstart.judge import VERDICT_PATTERN, reversed_sum, solve_prompt, verdict_prompt
    from hybridflow.rewards.judge import JudgeParseError, parse_score

    assert reversed_sum("052") == "250"
    assert solve_prompt("07+45=") == [{"role": "user", "content": "07+45="}]
    assert verdict_prompt("07+45=", "250", "053") == [{"role": "user", "content": "07+45="},
                                                      {"role": "assistant", "content": "250"},
                                                      {"role": "user", "content": "=053"}]
    assert parse_score("1", VERDICT_PATTERN) == 1.0 and parse_score("0", VERDICT_PATTERN) == 0.0
    with pytest.raises(JudgeParseError):
        parse_score("+", VERDICT_PATTERN)


def test_judge_rows_are_balanced_near_misses_of_the_true_sum():
    from hybridflow.quickstart.addition import held_out_rows
    from hybridflow.quickstart.judge import judge_rows, near_misses

    train, _ = held_out_rows(300, 20, seed=4)
    rows = judge_rows(train, seed=4)
    assert len(rows) == 2 * len(train)
    for r in rows:  # question -> the sum, digits reversed; "=" + candidate -> verdict
        question, reference, candidate, verdict = (m["content"] for m in r["messages"])
        assert [m["role"] for m in r["messages"]] == ["user", "assistant", "user", "assistant"]
        truth = f"{int(question[:2]) + int(question[3:5]):03d}"
        assert reference == truth[::-1] and candidate[0] == "="
        assert verdict == ("1" if candidate[1:] == truth else "0")
    verdicts = [r["messages"][-1]["content"] for r in rows]
    assert verdicts.count("1") == verdicts.count("0") == len(train)  # balanced classes
    rng = random.Random(0)
    others = ["123", "052"]
    assert all(near_misses("052", rng, others) != "052" for _ in range(200))
    kinds = {near_misses("052", random.Random(i), others) for i in range(300)}
    assert kinds >= {"053", "051", "042", "062", "502", "123", "52", "05", "0052"}


def test_a_judge_below_the_agreement_floor_stops_the_run_and_says_why(tmp_path):
    from hybridflow.quickstart.judge import JudgeTooWeak, run_judge_quickstart

    with pytest.raises(JudgeTooWeak, match="min_judge_agreement=0.9.*judge_sft_steps"):
        run_judge_quickstart(str(tmp_path), policy_sft_steps=1, judge_sft_steps=2, train_size=200, test_size=20)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "stopped" in summary and summary["judge_heldout_agreement"] < 0.9
    assert not (tmp_path / "metrics.jsonl").exists()  # no RL step ran


def test_above_the_floor_the_demo_runs_grpo_on_the_judge_and_writes_its_results(tmp_path):
    """Toy scale (an untrained judge, the floor lowered to 0): the run reaches RL, steps on the judge's scores, and
    writes the summary (every key), the metrics and the report."""
    from hybridflow.quickstart.judge import run_judge_quickstart

    summary = run_judge_quickstart(str(tmp_path), policy_sft_steps=2, judge_sft_steps=2, rl_steps=2, train_size=200,
                                   test_size=20, test_freq=1, min_judge_agreement=0.0)
    assert list(summary) == ["before", "after", "judge_heldout_agreement", "judge_agreement_during_rl", "steps",
                             "seconds", "cpu_seconds", "policy_sft_seconds", "judge_sft_seconds", "rl_seconds",
                             "backend", "seed"]
    assert (summary["before"]["step"], summary["after"]["step"], summary["steps"]) == (0, 2, 2)
    assert 0.0 < summary["judge_agreement_during_rl"] <= 1.0  # the judge scored the RL steps' answers
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "report.html").exists()
