"""The learning-history gate itself (tests/learning_history.py): the band, the failure with its plot, recording."""

from __future__ import annotations

import json

import pytest

import learning_history as lh


def _history(tmp_path, runs):
    path = tmp_path / "history.json"
    path.write_text(json.dumps({"t": {"runs": [{"date": "d", "curves": {"reward": r}} for r in runs]}}))
    return path


RECORDED = [[0.1, 0.2, 0.4, 0.6, 0.7, 0.8], [0.1, 0.25, 0.45, 0.6, 0.75, 0.8]]


def test_a_curve_inside_or_above_the_band_passes(tmp_path):
    path = _history(tmp_path, RECORDED)
    lh.check_learning("t", {"reward": [0.1, 0.22, 0.42, 0.6, 0.72, 0.8]}, tmp_path / "out", path)
    lh.check_learning("t", {"reward": [0.3, 0.6, 0.9, 1.0, 1.0, 1.0]}, tmp_path / "out", path)  # better: fine
    assert not (tmp_path / "out").exists()


def test_a_curve_below_the_band_fails_with_a_plot(tmp_path):
    path = _history(tmp_path, RECORDED)
    slower = [0.1, 0.12, 0.2, 0.3, 0.4, 0.45]  # still climbs 0.35: a margin test would pass it
    with pytest.raises(AssertionError, match=r"fell below the band of its 2 recorded runs.*reward at step") as e:
        lh.check_learning("t", {"reward": slower}, tmp_path / "out", path)
    plot = tmp_path / "out" / "t.png"
    assert str(plot) in str(e.value) and plot.read_bytes()[:4] == b"\x89PNG"


def test_the_band_is_min_max_of_the_smoothed_runs_widened_by_the_tolerance():
    low, high = lh.band([[0.0, 0.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]])
    # smoothed: the same constants; std 0.15 -> tol max(0.1, 0.45) = 0.45
    assert low.tolist() == pytest.approx([-0.45] * 4) and high.tolist() == pytest.approx([0.75] * 4)


def test_recording_appends_and_keeps_the_last_runs(tmp_path, monkeypatch):
    path = tmp_path / "history.json"
    lh.check_learning("t", {"reward": [0.5]}, tmp_path, path)  # nothing recorded: not gated, nothing written
    assert not path.exists()
    monkeypatch.setenv(lh.RECORD_ENV, "1")
    for i in range(lh.KEEP + 2):
        lh.check_learning("t", {"reward": [float(i)]}, tmp_path, path)
    runs = json.loads(path.read_text())["t"]["runs"]
    assert [r["curves"]["reward"] for r in runs] == [[float(i)] for i in range(2, lh.KEEP + 2)]


def test_every_learning_test_in_the_history_is_recorded():
    """The committed history holds curves (no empty entries), each a list of numbers."""
    history = lh.load_history()
    for name, entry in history.items():
        assert entry["runs"], name
        for run in entry["runs"]:
            assert all(isinstance(x, (int, float)) for curve in run["curves"].values() for x in curve), name
