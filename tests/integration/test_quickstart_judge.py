"""``hybridflow quickstart --task judge`` (RLAIF on CPU): the judge's training data, how it is asked, the agreement
floor that stops the run before RL, and -- full scale, ~4-8 minutes each -- that GRPO on the judge's scores raises
held-out accuracy (checked by the exact rule), for today's judge (it works the sum out first, then grades) and for a
judge that is told no answer and grades in one turn (``judge_mode="direct"``). Both learning tests gate their curves
on ``tests/learning_history.json`` (``tests/learning_history.py``).
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
                             "backend", "seed", "judge_mode"]
    assert (summary["before"]["step"], summary["after"]["step"], summary["steps"]) == (0, 2, 2)
    assert 0.0 < summary["judge_agreement_during_rl"] <= 1.0  # the judge scored the RL steps' answers
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "metrics.jsonl").exists() and (tmp_path / "report.html").exists()


def test_the_direct_judge_is_told_no_answer():
    from hybridflow.quickstart.addition import held_out_rows
    from hybridflow.quickstart.judge import direct_prompt, judge_rows

    assert direct_prompt("07+45=", "052") == [{"role": "user", "content": "07+45=250"}]
    train, _ = held_out_rows(50, 5, seed=4)
    for row in judge_rows(train, seed=4, mode="direct"):
        question, verdict = (m["content"] for m in row["messages"])
        truth = f"{int(question[:2]) + int(question[3:5]):03d}"
        assert len(row["messages"]) == 2 and question[5] == "=" and question[2] == "+"
        assert verdict == ("1" if question[6:] == truth[::-1] else "0")  # only the candidate follows the question


# held-out accuracy (exact rule) must rise this much from before RL to its best validation (measured in the
# docstrings of the tests; a judge the policy learns to game rises, then falls: the best is what RL reached)
# Only the judge told the answer: the judge that is not (judge_mode=direct, tested above for what it is asked) agreed
# with the exact rule on 70 % of held-out pairs and the policy learned to game it (reward ~1.0 at 21-33 % agreement,
# 2026-11-28): no learning gain is claimed for it yet.
JUDGE_GAIN = {"reference": 0.1}


@pytest.mark.learning
@pytest.mark.timeout(1800)  # the whole demo: 4-8 minutes on an idle 2-core machine, far more beside other jobs
@pytest.mark.parametrize("mode", sorted(JUDGE_GAIN))
def test_grpo_on_the_judge_raises_held_out_accuracy(mode, tmp_path):
    """The whole demo at its defaults (seed 1). Measured: see tests/learning_history.json for the recorded curves."""
    from hybridflow.quickstart.judge import VAL_KEY, run_judge_quickstart

    from learning_history import check_learning

    summary = run_judge_quickstart(str(tmp_path), judge_mode=mode, min_judge_agreement=0.0)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    heldout = [rec[VAL_KEY] for rec in lines if VAL_KEY in rec]
    reward = [rec["critic/score/mean"] for rec in lines if "critic/score/mean" in rec]
    print(f"judge {mode}: agreement {summary['judge_heldout_agreement']:.3f}, held-out {heldout}")
    assert heldout[0] == summary["before"]["accuracy"] and len(reward) == summary["steps"]
    assert max(heldout[1:]) >= heldout[0] + JUDGE_GAIN[mode], (mode, heldout)
    check_learning(f"test_quickstart_judge/{mode}", {"reward": reward, "heldout_accuracy": heldout}, tmp_path)
