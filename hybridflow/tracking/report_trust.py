"""The run report's trust section: the drift panel and the weight-version panel (issue 34).

* **Drift** -- the gap between the rollout's and the trainer's token probabilities per step (``drift/gap``) with the
  run's warn and stop levels, how many steps were checked, and a table of the flagged steps with the causes the
  detector named (``drift/cause/*``; the words are in the run's error box and docs/drift.md);
* **Weight versions** -- the version the rollout generated each step with (``weights/version``, the async modes'
  ``fully_async/count/current_param_version``), the samples' staleness (``training/staleness/*``) and the weight
  digest checks after the syncs (``weights/digest_*``).

Rendered by :func:`trust_html` with the report's own plotting function (passed in: this module draws nothing
itself), so ``tracking/report.py`` only calls it.
"""

from __future__ import annotations

import html
from typing import Any, Callable, Mapping, Sequence

__all__ = ["TRUST_PANELS", "trust_html"]

TRUST_PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Drift: rollout vs trainer", "mean |p_rollout - p_trainer|",
     ("drift/gap", "drift/warn_level", "drift/stop_level")),
    ("Weight versions", "version / versions behind",
     ("weights/version", "fully_async/count/current_param_version", "training/staleness/max",
      "training/staleness/mean")),
)
CAUSE_PREFIX = "drift/cause/"

PlotFn = Callable[[str, str, Sequence[Mapping[str, Any]], Sequence[str]], str]


def _num(rec: Mapping[str, Any], key: str) -> float | None:
    v = rec.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _drift_summary(history: Sequence[Mapping[str, Any]]) -> str:
    steps = [r for r in history if _num(r, "drift/tripped") is not None]
    if not steps:
        return "<p>The drift detector did not run (trainer.drift.enable=false, or no step finished).</p>"
    checked = [r for r in steps if (_num(r, "drift/rows_checked") or 0) > 0]
    gaps = [g for g in (_num(r, "drift/gap") for r in checked) if g is not None]
    flagged = [r for r in steps if (_num(r, "drift/tripped") or 0) > 0]
    last = steps[-1]
    text = (f"<p>Checked on {len(checked)} of {len(steps)} steps (rows of older weights are not compared); largest gap "
            f"{max(gaps):.3g}" if gaps else f"<p>Checked on 0 of {len(steps)} steps")
    text += (f"; warn level {_num(last, 'drift/warn_level'):.3g}, stop level {_num(last, 'drift/stop_level'):.3g}. "
             f"{len(flagged)} step(s) flagged.</p>")
    if not flagged:
        return text
    rows = []
    for r in flagged:
        causes = sorted(k[len(CAUSE_PREFIX):] for k, v in r.items() if k.startswith(CAUSE_PREFIX) and v)
        gap = _num(r, "drift/gap")
        rows.append(f"<tr><td>{html.escape(str(r.get('step')))}</td><td>{'stop' if r['drift/tripped'] >= 2 else 'warn'}"
                    f"</td><td>{'' if gap is None else f'{gap:.3g}'}</td><td>{html.escape(', '.join(causes))}</td>"
                    f"<td>{_num(r, 'drift/template_mismatch_fraction') or 0:.0%}</td></tr>")
    return (text + "<table><thead><tr><th>step</th><th>level</th><th>gap</th><th>likely cause</th>"
            "<th>prompts not the trainer's rendering</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _weights_summary(history: Sequence[Mapping[str, Any]]) -> str:
    verified = sum(int(_num(r, "weights/digest_verified") or 0) for r in history)
    unverified = sum(int(_num(r, "weights/digest_unverified") or 0) for r in history)
    stale = [s for s in (_num(r, "training/staleness/max") for r in history) if s is not None]
    parts = [f"{verified} engine weight digest(s) matched the trainer's after a sync"]
    if unverified:
        parts.append(f"{unverified} could not be read (an engine that does not show its weights)")
    if stale:
        parts.append(f"the oldest trained sample was {int(max(stale))} version(s) behind")
    return "<p>" + "; ".join(parts) + ".</p>"


def trust_html(history: Sequence[Mapping[str, Any]], plot: PlotFn, keys_of: Callable[..., list[str]]) -> str:
    """The trust section: each panel (``plot(title, ylabel, history, keys)`` -> base64 PNG, ``keys_of(history,
    patterns)`` -> the logged keys) under its summary."""
    parts = ["<h2>Trust: drift and weight versions</h2>"]
    for (title, ylabel, patterns), summary in zip(TRUST_PANELS, (_drift_summary, _weights_summary)):
        parts.append(f"<h3>{html.escape(title)}</h3>" + summary(history))
        keys = keys_of(history, patterns)
        if keys:
            png = plot(title, ylabel, history, keys)
            parts.append(f"<img alt='{html.escape(title)}' src='data:image/png;base64,{png}'>")
    return "".join(parts)
