"""The learning-history gate: a learning test's curve must stay inside the band of its recorded history.

A learning test asserts that reward climbs by a margin; a change that makes learning *worse but not broken*
(slower, lower plateau) passes that. So each learning test also hands its curves -- reward by step, held-out
accuracy by step -- to :func:`check_learning`, which compares them with the runs recorded for the same test in
``tests/learning_history.json`` (committed):

* the band of a curve at step t is [min - tol, max + tol] over the recorded runs' values at t, with
  ``tol = max(TOL_ABS, TOL_STD x std)``, after a moving average over ``SMOOTH`` steps (one lucky or unlucky step
  does not decide); only falling *below* the band fails (learning better is not a regression; it is printed);
* a failure writes ``<test>.png`` (matplotlib, in the lock) into the test's output folder: the history's band, its
  runs and this run, and the assertion names that file;
* a test without history is not gated (it says so); record its history as below and commit it.

Updating the history (after a change that is *meant* to move a curve, or to widen the band with more seeds):
``HYBRIDFLOW_RECORD_LEARNING=1 pytest tests/integration/test_learning.py ...`` appends each run's curves (keeping
the last ``KEEP`` runs per test) instead of gating; commit the JSON with the change that moved them and say why.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import numpy as np

HISTORY = Path(__file__).with_name("learning_history.json")
RECORD_ENV = "HYBRIDFLOW_RECORD_LEARNING"
KEEP = 5
SMOOTH = 3
TOL_ABS = 0.1
TOL_STD = 3.0

__all__ = ["HISTORY", "band", "check_learning", "load_history"]


def load_history(path: Path = HISTORY) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _smooth(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if len(v) < SMOOTH:
        return v
    kernel = np.ones(SMOOTH) / SMOOTH
    head = [v[: i + 1].mean() for i in range(SMOOTH - 1)]  # the first steps: what is there
    return np.concatenate([head, np.convolve(v, kernel, mode="valid")])


def band(runs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per step of the smoothed recorded runs (cut to the shortest)."""
    n = min(len(r) for r in runs)
    stack = np.stack([_smooth(r[:n]) for r in runs])
    tol = np.maximum(TOL_ABS, TOL_STD * stack.std(axis=0))
    return stack.min(axis=0) - tol, stack.max(axis=0) + tol


def _record(history: dict, name: str, curves: dict[str, list[float]], path: Path) -> None:
    entry = history.setdefault(name, {"runs": []})
    entry["runs"].append({"date": datetime.date.today().isoformat(),
                          "curves": {k: [round(float(x), 4) for x in v] for k, v in curves.items()}})
    entry["runs"] = entry["runs"][-KEEP:]
    path.write_text(json.dumps(history, indent=1, sort_keys=True) + "\n")


def _plot(name: str, curves: dict[str, list[float]], runs: list[dict], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.5), squeeze=False)
    for ax, (key, values) in zip(axes[0], curves.items()):
        recorded = [r["curves"][key] for r in runs if key in r["curves"]]
        if recorded:
            low, high = band(recorded)
            ax.fill_between(range(1, len(low) + 1), low, high, alpha=0.2, label="history band")
            for r in recorded:
                ax.plot(range(1, len(r) + 1), r, color="grey", linewidth=0.8)
        ax.plot(range(1, len(values) + 1), values, color="red", marker="o", label="this run")
        ax.plot(range(1, len(values) + 1), _smooth(values), color="red", linestyle="--", label="smoothed")
        ax.set_title(f"{name}: {key}")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name.replace('/', '_').replace('[', '_').replace(']', '')}.png"
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _below(values: list[float], recorded: list[list[float]]) -> list[tuple[int, float, float]]:
    low, high = band(recorded)
    v = _smooth(values[: len(low)])
    above = [t + 1 for t in range(len(v)) if v[t] > high[t]]
    if above:
        print(f"learning history: above the band at steps {above} (better than recorded)")
    return [(t + 1, float(v[t]), float(low[t])) for t in range(len(v)) if v[t] < low[t]]


def check_learning(name: str, curves: dict[str, list[float]], out_dir, path: Path = HISTORY) -> None:
    """Gate ``curves`` (key -> value by step) of the test ``name`` on its history (see the module docstring)."""
    history = load_history(path)
    runs = history.get(name, {}).get("runs", [])
    if os.environ.get(RECORD_ENV) == "1":
        _record(history, name, curves, path)
        return
    if not runs:
        print(f"learning history: no recorded runs for {name}: not gated (record them with {RECORD_ENV}=1)")
        return
    failures = {}
    for key, values in curves.items():
        recorded = [r["curves"][key] for r in runs if key in r["curves"]]
        if recorded:
            below = _below(values, recorded)
            if below:
                failures[key] = below
    if failures:
        plot = _plot(name, curves, runs, Path(out_dir))
        detail = "; ".join(f"{key} at step {t}: {v:.3f} < {lo:.3f}" for key, rows in failures.items()
                           for t, v, lo in rows[:3])
        raise AssertionError(f"{name}: the learning curve fell below the band of its {len(runs)} recorded runs "
                             f"({detail}); plot: {plot}. If the change is meant to move it, re-record with "
                             f"{RECORD_ENV}=1 (tests/learning_history.py)")
