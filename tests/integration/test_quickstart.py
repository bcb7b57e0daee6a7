"""The quickstart pipeline end to end at toy scale: warm-up SFT, GRPO through the framework, summary + report.

The real demo (minutes, accuracy gain) is measured by hand and reported; this checks the plumbing.
"""

from __future__ import annotations

import json

import pytest


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
