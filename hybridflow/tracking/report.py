"""End-of-run report: one self-contained ``report.html`` with plots over steps, the last metrics and samples.

The report answers "did it learn, how fast, and what does it write?" without a tracking server: score and
reward, response length, KL, entropy, losses, throughput/MFU, stage times, memory and validation curves
(each panel drawn only if its metrics were logged), a table of the last value of every metric, and sample
generations (multi-turn ones with the model's tokens and the observations -- tool results, user turns -- marked
apart, from their ``segments``).  Failures come first, in a warning box: the steps where trajectories failed,
rewards could not be scored or tools crashed (with counts and the worst fraction), and why a run stopped.
PNGs are embedded as base64 so the file can be mailed or attached to an issue as-is; all text from the model
is HTML-escaped. The file is written to a temp name and renamed, so a reader never sees half.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

from hybridflow.tracking.loggers import flatten_dict
from hybridflow.tracking.report_trust import trust_html
from hybridflow.tracking.units import is_duration

__all__ = ["write_report", "render_report", "load_history", "load_samples", "PLOT_PANELS", "panel_figure"]

# (panel title, y label, metric names or prefixes ending in "*"). A y label that is a unit must be the unit of
# every metric drawn on it (tracking/units.py; tests/tracking/test_report.py checks it). The two time panels
# draw durations only: a ``timing_s/`` name that is not a timed stage (a token count, as earlier versions and
# verl log the slowest trajectory's lengths) is left out of them.
PLOT_PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Score and reward", "per sequence", ("critic/score/mean", "critic/rewards/mean")),
    ("Response length", "tokens", ("response_length/mean", "response_length/max", "response_length/min")),
    ("KL", "nats", ("actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty")),
    ("Entropy", "nats / token", ("actor/entropy",)),
    ("Losses", "loss", ("actor/pg_loss", "critic/vf_loss")),
    ("Throughput", "tokens / s / device", ("perf/throughput",)),
    ("MFU", "fraction of peak", ("perf/mfu/*",)),
    ("Time per stage", "seconds", ("timing_s/*",)),
    ("Agent-loop time per trajectory", "seconds", ("timing_s/agent_loop/*",)),
    ("Memory", "GiB", ("perf/cpu_memory_used_gb", "perf/max_memory_allocated_gb")),
    ("Validation", "value", ("val-core/*",)),
)
_TIME_PANELS = {"Time per stage": lambda k: is_duration(k) and "/" not in k.removeprefix("timing_s/"),
                "Agent-loop time per trajectory": is_duration}
MAX_SAMPLES = 32

# (what failed, its per-step fraction metric, its per-step count metrics)
FAILURE_METRICS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("trajectories failed (agent loop raised)", "rollout/failed_fraction", ("agent/error_count",)),
    ("rewards could not be scored (error or timeout)", "reward/error_fraction",
     ("reward/error_count", "reward/timeout_count")),
    ("tool calls crashed", "rollout/tool_crash_fraction",
     ("agent/tool_errors/tool_exception", "agent/tool_errors/timeout", "agent/tool_errors/bad_return")),
)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _panel_keys(history: Sequence[Mapping[str, Any]], patterns: Sequence[str], title: str = "") -> list[str]:
    present: dict[str, None] = {}
    for rec in history:
        for k, v in rec.items():
            if _is_number(v):
                present.setdefault(k)
    keys = []
    for p in patterns:
        if p.endswith("*"):
            keys += sorted(k for k in present if k.startswith(p[:-1]) and k not in keys)
        elif p in present:
            keys.append(p)
    keep = _TIME_PANELS.get(title)
    return [k for k in keys if keep(k)] if keep else keys


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, rec in enumerate(history):
        v = rec.get(key)
        if _is_number(v):
            xs.append(rec.get("step", i + 1))
            ys.append(float(v))
    return xs, ys


def _common_prefix(keys: Sequence[str]) -> str:
    """The longest shared prefix ending in "/" (shown once as the legend's title instead of on every line)."""
    prefix = os.path.commonprefix(list(keys)) if len(keys) > 1 else ""
    return prefix[:prefix.rfind("/") + 1]


def panel_figure(title: str, ylabel: str, history: Sequence[Mapping[str, Any]], keys: Sequence[str]):
    """One panel as a matplotlib ``Figure``: the curves, and the legend to the right of the axes (outside the
    plotting area, so it never covers a line). A bare ``Figure`` renders with Agg and never touches pyplot's
    global backend or a display, so this is safe in headless workers and inside user notebooks."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.0, 3.4), dpi=90)
    ax = fig.add_subplot(1, 1, 1)
    prefix = _common_prefix(keys)
    for key in keys:
        xs, ys = _series(history, key)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key.removeprefix(prefix))
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              title=prefix or None, title_fontsize=7)
    # fixed margins instead of tight_layout(): that costs a second full draw, doubling report time
    fig.subplots_adjust(left=0.12, right=0.64, top=0.9, bottom=0.15)
    return fig


def _plot_png(title: str, ylabel: str, history: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """One panel as a base64 PNG."""
    buf = io.BytesIO()
    panel_figure(title, ylabel, history, keys).savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _fmt(v: Any) -> str:
    if _is_number(v):
        f = float(v)
        return f"{f:.4g}"
    return str(v)


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str], cls: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _last_metrics(history: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, Any]]:
    last: dict[str, tuple[int, Any]] = {}
    for i, rec in enumerate(history):
        for k, v in rec.items():
            if k != "step":
                last[k] = (rec.get("step", i + 1), v)
    return dict(sorted(last.items()))


_HERMES_CALL = re.compile(r"&lt;tool_call&gt;.*?&lt;/tool_call&gt;", re.DOTALL)  # complete calls, escaped


def _response_html(sample: Mapping[str, Any]) -> str:
    """The response; a multi-turn one (``segments``: ``[text, mask]`` runs) with model tokens (mask 1) and
    observations (mask 0: tool results, user turns -- never trained on) marked apart, complete hermes
    ``<tool_call>`` blocks highlighted."""
    segments = sample.get("segments")
    if not segments:
        return f"<pre>{html.escape(str(sample.get('response', '')))}</pre>"
    spans = []
    for text, mask in segments:
        body = html.escape(str(text))
        if mask:
            body = _HERMES_CALL.sub(lambda m: f"<span class='call'>{m.group(0)}</span>", body)
            spans.append(f"<span class='model' title='model tokens (trained)'>{body}</span>")
        else:
            spans.append(f"<span class='obs' title='observation (response_mask 0, not trained)'>{body}</span>")
    return f"<pre>{''.join(spans)}</pre>"


def _samples_html(samples: Sequence[Mapping[str, Any]]) -> str:
    if not samples:
        return "<p>No sample generations were logged.</p>"
    shown = list(samples)[-MAX_SAMPLES:]
    rows = [
        [
            html.escape(str(s.get("step", ""))),
            f"<pre>{html.escape(str(s.get('prompt', '')))}</pre>",
            _response_html(s),
            html.escape(_fmt(s.get("score", ""))),
        ]
        for s in shown
    ]
    note = f"<p>Last {len(shown)} of {len(samples)} samples.</p>" if len(samples) > len(shown) else ""
    if any(s.get("segments") for s in shown):
        note += ("<p class='legend'>Multi-turn responses: <span class='model'>model tokens</span> "
                 "(<span class='call'>tool calls</span> highlighted) and <span class='obs'>observations</span> "
                 "(tool results and the template around them; <code>response_mask</code> 0, never trained on).</p>")
    return note + _table(rows, ["step", "prompt", "response", "score"], "samples")


def _failures_html(history: Sequence[Mapping[str, Any]], error: str | None) -> str:
    """A warning box when anything failed: one line per kind (steps affected, total count, worst fraction),
    and the error that stopped the run.  Empty when nothing failed."""
    lines = []
    for what, fraction_key, count_keys in FAILURE_METRICS:
        hit = [rec for rec in history if _is_number(rec.get(fraction_key)) and rec[fraction_key] > 0]
        if not hit:
            continue
        total = sum(float(rec.get(k, 0) or 0) for rec in hit for k in count_keys if _is_number(rec.get(k, 0)))
        worst = max(float(rec[fraction_key]) for rec in hit)
        steps = ", ".join(str(rec.get("step", "?")) for rec in hit[:20]) + (", ..." if len(hit) > 20 else "")
        lines.append(f"<li><b>{html.escape(what)}</b>: in {len(hit)} step(s) ({html.escape(steps)}), "
                     f"{total:.0f} in all, at worst {worst:.0%} of a step (<code>{fraction_key}</code>)</li>")
    if not lines and not error:
        return ""
    parts = ["<div class='failures'><h2>Failures</h2>"]
    if error:
        parts.append(f"<p><b>The run stopped with an error:</b></p><pre>{html.escape(error)}</pre>")
    if lines:
        parts.append("<ul>" + "".join(lines) + "</ul><p>Failed items were counted and left out of training; "
                     "a step where more than <code>trainer.tolerated_failure_fraction</code> of them failed "
                     "stops the run.</p>")
    parts.append("</div>")
    return "".join(parts)


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.5em;border-bottom:1px solid #ddd}
.plots{display:flex;flex-wrap:wrap;gap:8px} .plots img{border:1px solid #eee}
table{border-collapse:collapse;font-size:0.85em} td,th{border:1px solid #ddd;padding:3px 6px;vertical-align:top}
th{background:#f5f5f5;text-align:left} pre{white-space:pre-wrap;word-break:break-word;margin:0;max-width:60em}
.obs{background:#e8eef7;color:#445;border:1px dashed #9ab;font-style:italic} .call{background:#fff1c2;font-weight:600}
.failures{background:#fdecea;border:2px solid #d93025;padding:0.2em 1em 0.5em;margin:1em 0}
.failures h2{color:#b3261e;border:none}
"""


def render_report(
    history: Sequence[Mapping[str, Any]],
    samples: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None = None,
    title: str = "hybridflow run report",
    error: str | None = None,
    head: str = "",
) -> str:
    """The report page as one HTML string (``head``: extra markup for ``<head>``, e.g. the live page's refresh)."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>{head}",
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    steps = [rec.get("step", i + 1) for i, rec in enumerate(history)]
    span = f"steps {steps[0]}–{steps[-1]}" if steps else "no steps"
    parts.append(f"<p>{len(history)} logged records, {html.escape(span)}.</p>")
    parts.append(_failures_html(history, error))
    if summary:
        rows = [[html.escape(str(k)), html.escape(_fmt(v))] for k, v in flatten_dict(summary, sep=" / ").items()]
        parts.append("<h2>Summary</h2>" + _table(rows, ["", "value"]))
    parts.append("<h2>Curves</h2><div class='plots'>")
    drawn = 0
    for panel_title, ylabel, patterns in PLOT_PANELS:
        keys = _panel_keys(history, patterns, panel_title)
        if keys:
            png = _plot_png(panel_title, ylabel, history, keys)
            parts.append(f"<img alt='{html.escape(panel_title)}' src='data:image/png;base64,{png}'>")
            drawn += 1
    parts.append("</div>" if drawn else "</div><p>No plottable metrics were logged.</p>")
    parts.append(trust_html(history, _plot_png, _panel_keys))  # the drift and weight-version panels
    rows = [
        [html.escape(k), html.escape(str(step)), html.escape(_fmt(v))]
        for k, (step, v) in _last_metrics(history).items()
    ]
    parts.append("<h2>Last metrics</h2>" + (_table(rows, ["metric", "step", "value"]) if rows else "<p>None.</p>"))
    parts.append("<h2>Sample generations</h2>" + _samples_html(samples))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    output_dir: str | Path,
    history: Sequence[Mapping[str, Any]],
    samples: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None = None,
    title: str = "hybridflow run report",
    error: str | None = None,
) -> Path:
    """Write ``<output_dir>/report.html`` atomically and return its path.

    ``history``: one dict per logged step (``{"step": N, metric: value, ...}``, e.g. from :func:`load_history`);
    ``samples``: dicts with ``prompt``, ``response``, ``score`` (and optionally ``step``); ``summary``: a few
    headline numbers (before/after accuracy, wall time) shown first; ``error``: why the run stopped, shown in
    the failures box at the top.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = render_report(history, samples, summary, title, error)
    target = out / "report.html"
    fd, tmp = tempfile.mkstemp(prefix=".report.", suffix=".html.tmp", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"No such metrics file: {path}. Enable the 'file' logger (trainer.logger=[console,file])."
        )
    records = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            # A torn last line is what a killed run leaves behind; anything else is worth a warning.
            if n != len(lines):
                warnings.warn(f"{path}:{n}: skipping a line that is not valid JSON", stacklevel=3)
    return records


def load_history(metrics_jsonl_path: str | Path) -> list[dict[str, Any]]:
    """Metric records from a ``metrics.jsonl``, one per step, sorted by step.

    Records logged for the same step (training and validation metrics, or a step re-logged after resuming)
    are merged, later values winning; a torn last line from a crashed run is ignored.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for rec in _read_jsonl(metrics_jsonl_path):
        if "step" not in rec:
            continue
        by_step.setdefault(int(rec["step"]), {}).update(rec)
    return [by_step[s] for s in sorted(by_step)]


def load_samples(generations_jsonl_path: str | Path) -> list[dict[str, Any]]:
    """Sample generations written by the ``file`` logger (``generations.jsonl``), in logging order."""
    return _read_jsonl(generations_jsonl_path)
