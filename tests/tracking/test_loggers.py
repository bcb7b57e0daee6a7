"""Tracking and its backends: JSONL file, console lines and live bar, tensorboard events, missing packages."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest
import torch

from hybridflow.tracking.console import ConsoleLogger, format_metrics_line
from hybridflow.tracking.loggers import LOGGER_BACKENDS, MissingDependencyError
from hybridflow.tracking.tracking import Tracking

STEP1 = {"critic/score/mean": 0.75, "response_length/mean": 3.0, "actor/pg_loss": -0.0123, "actor/lr": 1e-6}


def test_file_logger_writes_one_flushed_json_object_per_step(tmp_path):
    tr = Tracking("proj", "exp", ["file"], config={"a": {"b": 1}}, output_dir=tmp_path)
    tr.log({"critic/score/mean": torch.tensor(0.5), "n": np.int64(3), "flag": True}, step=1)
    # readable before finish(): every line is flushed as it is written
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l) for l in lines] == [{"step": 1, "critic/score/mean": 0.5, "n": 3, "flag": 1}]
    tr.log({"critic/score/mean": 0.75}, step=2)
    tr.log_generations([{"prompt": "1+1=", "response": "2", "score": 1.0}, ("2+2=", "5", 0)], step=2)
    tr.finish()
    tr.finish()  # idempotent
    records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and records[1]["critic/score/mean"] == 0.75
    gens = [json.loads(l) for l in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert gens == [
        {"step": 2, "prompt": "1+1=", "response": "2", "score": 1.0},
        {"step": 2, "prompt": "2+2=", "response": "5", "score": 0},
    ]
    assert tr.history[0]["step"] == 1 and len(tr.samples) == 2


def test_non_scalar_metric_is_a_clear_error(tmp_path):
    with Tracking("p", "e", "file", output_dir=tmp_path) as tr:
        with pytest.raises(TypeError, match="actor/pg_loss.*reduce_metrics"):
            tr.log({"actor/pg_loss": [1.0, 2.0]}, step=1)


def test_console_plain_lines_when_not_a_tty():
    out = io.StringIO()
    logger = ConsoleLogger("p", "e", stream=out)
    assert not logger.live
    logger.log(STEP1, step=1)
    logger.log({"critic/score/mean": 1, "note": "text is skipped"}, step=2)
    logger.finish()
    lines = out.getvalue().splitlines()
    assert lines == [
        "step:1 - critic/score/mean:0.750 - response_length/mean:3.000 - actor/pg_loss:-0.012 - actor/lr:1.000e-06",
        "step:2 - critic/score/mean:1",
    ]


def test_console_line_is_parseable_like_verl_logs():
    line = format_metrics_line({"critic/rewards/mean": 0.4567, "timing_s/step": 12.0}, step=7)
    fields = dict(part.split(":", 1) for part in line.split(" - "))
    assert fields == {"step": "7", "critic/rewards/mean": "0.457", "timing_s/step": "12.000"}


def test_console_live_progress_bar():
    out = io.StringIO()
    logger = ConsoleLogger("proj", "exp", stream=out, force_terminal=True, total_steps=3)
    logger.log({**STEP1, "timing_s/step": 2.0}, step=1)
    logger.log({**STEP1, "timing_s/step": 2.0}, step=2)
    logger.log_generations([{"prompt": "p" * 500, "response": "r [bold]x[/bold]", "score": 1.0}], step=2)
    logger.finish()
    text = out.getvalue()
    assert "proj/exp" in text and "2/3" in text and "eta" in text
    assert "score=0.750" in text and "resp_len=3.000" in text and "pg_loss=-0.012" in text and "step_s=2.000" in text
    assert "[bold]x[/bold]" in text  # model text is printed verbatim, not interpreted as rich markup
    assert "p" * 200 not in text  # long prompts are shortened


def test_tensorboard_writes_event_files(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    tr = Tracking("p", "e", ["tensorboard"], output_dir=tmp_path)
    tr.log({"critic/score/mean": 0.25}, step=1)
    tr.log({"critic/score/mean": 0.5}, step=2)
    tr.log_generations([{"prompt": "a", "response": "b", "score": 1}], step=2)
    tr.finish()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("critic/score/mean")] == [(1, 0.25), (2, 0.5)]


@pytest.mark.parametrize("backend,module", [("wandb", "wandb"), ("tracking", "wandb"), ("mlflow", "mlflow"),
                                            ("swanlab", "swanlab"), ("tensorboard", "tensorboard")])
def test_missing_package_error_names_the_extra(tmp_path, monkeypatch, backend, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import <module>` fail as if not installed
    with pytest.raises(MissingDependencyError, match=rf"pip install hybridflow\[{module}\]"):
        Tracking("p", "e", ["file", backend], output_dir=tmp_path)


def test_unknown_backend_lists_known_ones(tmp_path):
    with pytest.raises(ValueError) as err:
        Tracking("p", "e", ["console", "tensorbord"], output_dir=tmp_path)
    msg = str(err.value)
    assert "tensorbord" in msg and "Did you mean 'tensorboard'" in msg
    for name in ("console", "file", "mlflow", "swanlab", "wandb"):
        assert name in msg


def test_registry_has_verl_names_and_alias():
    assert {"console", "file", "tensorboard", "wandb", "tracking", "mlflow", "swanlab"} <= set(LOGGER_BACKENDS.names())
    assert LOGGER_BACKENDS.get("tracking") is LOGGER_BACKENDS.get("wandb")


def test_bad_sample_is_a_clear_error(tmp_path):
    with Tracking("p", "e", "file", output_dir=tmp_path) as tr:
        with pytest.raises(KeyError, match="response"):
            tr.log_generations([{"prompt": "x", "score": 1}], step=1)
