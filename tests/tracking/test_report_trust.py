"""The run report's trust section (tracking/report_trust.py): the drift panel with its flagged steps and causes, and
the weight-version panel with the digest checks and staleness."""

from __future__ import annotations

from hybridflow.tracking.report import write_report


def _history():
    rows = []
    for step in (1, 2, 3):
        rows.append({"step": step, "drift/gap": 1e-9 if step < 3 else 0.02, "drift/warn_level": 1e-6,
                     "drift/stop_level": 1e-4, "drift/rows_checked": 8.0, "drift/tripped": 0.0 if step < 3 else 2.0,
                     "drift/template_mismatch_fraction": 0.0, "weights/version": float(step - 1),
                     "weights/digest_verified": 1.0, "training/staleness/max": 0.0})
    rows[-1]["drift/cause/weights"] = 1.0
    return rows


def test_the_report_has_a_drift_panel_naming_the_flagged_step_and_a_weight_version_panel(tmp_path):
    path = write_report(tmp_path, _history(), [], title="t/r", error="step 3: the rollout's log-probs drifted")
    text = open(path, encoding="utf-8").read()
    assert "Trust: drift and weight versions" in text
    assert "alt='Drift: rollout vs trainer'" in text and "alt='Weight versions'" in text
    assert "Checked on 3 of 3 steps" in text and "1 step(s) flagged" in text
    assert "<td>3</td><td>stop</td><td>0.02</td><td>weights</td>" in text
    assert "3 engine weight digest(s) matched the trainer's after a sync" in text


def test_a_run_without_the_detector_says_so(tmp_path):
    path = write_report(tmp_path, [{"step": 1, "critic/score/mean": 0.5}], [], title="t/r")
    text = open(path, encoding="utf-8").read()
    assert "The drift detector did not run" in text and "alt='Drift: rollout vs trainer'" not in text
