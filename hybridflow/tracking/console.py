"""Console logger: a live progress bar on a terminal, verl's ``step:N - key:val`` lines everywhere else.

On a TTY the user wants to *see the run learning*: a rich progress bar with ETA and the handful of metrics
that tell whether it works (score, response length, policy loss, step time), and one compact line per step
kept above the bar as history. Piped to a file or CI log, live rendering is noise, so each step becomes one
plain line in verl's format, which existing log parsers (verl's e2e ``check_results.py``) understand.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Mapping, Sequence, TextIO

__all__ = ["ConsoleLogger", "format_metrics_line", "format_value", "KEY_METRICS"]

# Shown on the progress bar, in this order, when present: (metric name, short label).
KEY_METRICS: tuple[tuple[str, str], ...] = (
    ("critic/score/mean", "score"),
    ("response_length/mean", "resp_len"),
    ("actor/pg_loss", "pg_loss"),
    ("timing_s/step", "step_s"),
)


def format_value(value: Any) -> str:
    """Readable number: ints as ints, floats with 3 decimals unless tiny/huge (lr 1e-6 must not print 0.000)."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v == 0.0:
        return str(v)
    return f"{v:.3f}" if 1e-3 <= abs(v) < 1e6 else f"{v:.3e}"


def format_metrics_line(data: Mapping[str, Any], step: int) -> str:
    """``step:N - key:val - ...`` over numeric values, in insertion order (verl's console format)."""
    parts = [f"step:{step}"]
    parts += [f"{k}:{format_value(v)}" for k, v in data.items() if isinstance(v, (int, float))]
    return " - ".join(parts)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConsoleLogger:
    """Progress bar + key metrics on a terminal; plain verl lines otherwise.

    ``force_terminal`` overrides TTY detection (tests, or ``rich`` in notebooks); ``total_steps`` sets the bar's
    length and so the ETA (unknown totals show elapsed time only).
    """

    def __init__(
        self,
        project_name: str = "",
        experiment_name: str = "",
        stream: TextIO | None = None,
        force_terminal: bool | None = None,
        total_steps: int | None = None,
    ):
        self.stream = stream if stream is not None else sys.stdout
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.live = is_tty if force_terminal is None else force_terminal
        self.title = "/".join(p for p in (project_name, experiment_name) if p) or "training"
        self.total_steps = total_steps
        self._progress = None
        self._task = None
        self._start_step: int | None = None

    def set_total_steps(self, total_steps: int) -> None:
        self.total_steps = total_steps
        if self._progress is not None:
            self._progress.update(self._task, total=total_steps)

    def _ensure_progress(self, step: int) -> None:
        if self._progress is not None:
            return
        from rich.console import Console
        from rich.table import Column
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(file=self.stream, force_terminal=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            # the metrics take the width left over and are cut last, so the counts and ETA always show
            TextColumn("{task.fields[metrics]}", table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
            console=console,
            transient=False,
            expand=True,
        )
        self._progress.start()
        # The ETA is extrapolated from steps done in *this* process (a resumed run starts mid-way).
        self._start_step = step - 1
        self._task = self._progress.add_task(self.title, total=self.total_steps, completed=step - 1, metrics="")

    def key_metrics_text(self, data: Mapping[str, Any]) -> str:
        return "  ".join(f"{label}={format_value(data[k])}" for k, label in KEY_METRICS if k in data)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        if not self.live:
            print(format_metrics_line(data, step), file=self.stream, flush=True)
            return
        self._ensure_progress(step)
        text = self.key_metrics_text(data)
        self._progress.console.print(f"step {step}: {text}" if text else f"step {step}", markup=False, highlight=False)
        self._progress.update(self._task, completed=step, metrics=text)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Print the first sample, shortened: enough to eyeball what the model writes, not a dump."""
        if not samples:
            return
        s = samples[0]
        line = (
            f"[step {step}] sample 1/{len(samples)}: prompt={_shorten(s['prompt'], 120)!r} "
            f"response={_shorten(s['response'], 200)!r} score={format_value(s['score'])}"
        )
        if self._progress is not None:
            self._progress.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream, flush=True)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
