"""Logger backends behind one small interface, registered by name (``trainer.logger=[console,file,...]``).

Every backend has ``log(data, step)``, ``log_generations(samples, step)`` and ``finish()``. The names are
verl's (``console``, ``file``, ``tensorboard``, ``wandb`` with ``tracking`` as its alias, ``mlflow``,
``swanlab``) so verl command lines keep working; ``prometheus`` (hybridflow's) serves the metrics on the driver's
``/metrics`` for a cluster to scrape (:mod:`hybridflow.tracking.prometheus`). Third-party packages are imported only when their backend is
chosen; a missing one is an error that names the extra to install. Remote services default to offline mode
when no credentials are configured, so a laptop run never blocks on a login prompt.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from hybridflow.tracking.console import ConsoleLogger
from hybridflow.utils.registry import Registry

__all__ = [
    "LoggerBackend",
    "BackendContext",
    "LOGGER_BACKENDS",
    "MissingDependencyError",
    "FileLogger",
    "TensorboardLogger",
    "WandbLogger",
    "MlflowLogger",
    "SwanlabLogger",
    "flatten_dict",
]


class LoggerBackend(Protocol):
    def log(self, data: Mapping[str, Any], step: int) -> None: ...
    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None: ...
    def finish(self) -> None: ...


@dataclass
class BackendContext:
    """What a backend needs to start: run names, the run config (flat or nested dict), where to write."""

    project_name: str
    experiment_name: str
    output_dir: Path
    config: dict[str, Any] = field(default_factory=dict)
    total_steps: int | None = None


class MissingDependencyError(ImportError):
    """An optional logger package is not installed."""


LOGGER_BACKENDS: Registry[Callable[[BackendContext], LoggerBackend]] = Registry("logger backend")


def _import_optional(module: str, extra: str, backend: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(
            f"The '{backend}' logger needs the '{module}' package, which is not installed. "
            f"Install it with `pip install hybridflow[{extra}]`, or remove '{backend}' from trainer.logger."
        ) from e


def flatten_dict(d: Mapping[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``: experiment trackers take flat hyper-parameter dicts."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping):
            out |= flatten_dict(v, key, sep)
        else:
            out[key] = v
    return out


def _json_default(obj: Any) -> Any:
    return str(obj)


class FileLogger:
    """``<output_dir>/metrics.jsonl`` (one ``{"step": N, ...}`` object per ``log``) and ``generations.jsonl``.

    Each line is flushed and fsync'ed as it is written: a crash or a killed job loses at most the line being
    written, and :func:`hybridflow.tracking.report.load_history` skips such a torn last line.
    """

    def __init__(self, output_dir: str | Path):
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.output_dir / "metrics.jsonl"
        self.generations_path = self.output_dir / "generations.jsonl"
        self._metrics = open(self.metrics_path, "a", encoding="utf-8")
        self._generations = None

    @staticmethod
    def _write(fh, record: Mapping[str, Any]) -> None:
        fh.write(json.dumps(record, default=_json_default) + "\n")
        fh.flush()
        os.fsync(fh.fileno())

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self._write(self._metrics, {"step": step, **data})

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        if self._generations is None:
            self._generations = open(self.generations_path, "a", encoding="utf-8")
        for sample in samples:
            self._write(self._generations, {"step": step, **sample})

    def finish(self) -> None:
        for fh in (self._metrics, self._generations):
            if fh is not None and not fh.closed:
                fh.close()


def _generations_markdown(samples: Sequence[Mapping[str, Any]]) -> str:
    rows = ["| prompt | response | score |", "|---|---|---|"]
    for s in samples:
        cells = [str(s["prompt"]), str(s["response"]), str(s["score"])]
        rows.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", "<br>") for c in cells) + " |")
    return "\n".join(rows)


class TensorboardLogger:
    """Scalars and generation tables as tensorboard events.

    Written under ``$TENSORBOARD_DIR`` (verl's variable) or ``<output_dir>/tensorboard``.
    """

    def __init__(self, output_dir: str | Path):
        _import_optional("tensorboard", "tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(os.environ.get("TENSORBOARD_DIR") or Path(output_dir) / "tensorboard")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for k, v in data.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        self.writer.add_text("generations", _generations_markdown(samples), global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


class WandbLogger:
    """Weights & Biases run; offline (sync later with ``wandb sync``) unless credentials or ``WANDB_MODE`` are set."""

    def __init__(self, ctx: BackendContext):
        self.wandb = _import_optional("wandb", "wandb", "wandb")
        mode = os.environ.get("WANDB_MODE") or ("online" if _has_wandb_credentials() else "offline")
        self.run = self.wandb.init(
            project=ctx.project_name,
            name=ctx.experiment_name,
            config=ctx.config,
            dir=str(ctx.output_dir),
            mode=mode,
        )

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.run.log(dict(data), step=step)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        table = self.wandb.Table(columns=["step", "prompt", "response", "score"])
        for s in samples:
            table.add_data(step, str(s["prompt"]), str(s["response"]), s["score"])
        self.run.log({"val/generations": table}, step=step)

    def finish(self) -> None:
        self.run.finish()


_MLFLOW_BAD_CHARS = re.compile(r"[^0-9A-Za-z_\-. /:]")


def _mlflow_key(key: str) -> str:
    """MLflow rejects '@' and most punctuation in metric names: ``mean@4`` -> ``mean_at_4``."""
    return _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))


class MlflowLogger:
    """MLflow run in experiment ``project_name``.

    Stored in a local ``<output_dir>/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` points elsewhere.
    """

    def __init__(self, ctx: BackendContext):
        self.mlflow = _import_optional("mlflow", "mlflow", "mlflow")
        out = Path(ctx.output_dir).resolve()
        out.mkdir(parents=True, exist_ok=True)
        # MLflow 3 refuses the ./mlruns file store; a local SQLite file needs no server.
        self.mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{out / 'mlflow.db'}")
        if self.mlflow.get_experiment_by_name(ctx.project_name) is None:
            self.mlflow.create_experiment(ctx.project_name, artifact_location=(out / "mlartifacts").as_uri())
        self.mlflow.set_experiment(ctx.project_name)
        self.run = self.mlflow.start_run(run_name=ctx.experiment_name)
        params = {_mlflow_key(k): str(v)[:500] for k, v in flatten_dict(ctx.config).items()}
        if params:
            self.mlflow.log_params(params)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        scalars = {_mlflow_key(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}
        self.mlflow.log_metrics(scalars, step=step)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        text = json.dumps([dict(s) for s in samples], default=_json_default, indent=1)
        self.mlflow.log_text(text, f"generations/step_{step}.json")

    def finish(self) -> None:
        self.mlflow.end_run()


class SwanlabLogger:
    """SwanLab run; offline unless ``SWANLAB_API_KEY`` or ``SWANLAB_MODE`` is set."""

    def __init__(self, ctx: BackendContext):
        self.swanlab = _import_optional("swanlab", "swanlab", "swanlab")
        mode = os.environ.get("SWANLAB_MODE") or ("cloud" if os.environ.get("SWANLAB_API_KEY") else "offline")
        self.swanlab.init(
            project=ctx.project_name,
            experiment_name=ctx.experiment_name,
            config=ctx.config,
            logdir=str(Path(ctx.output_dir) / "swanlog"),
            mode=mode,
        )

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.swanlab.log({k: v for k, v in data.items() if isinstance(v, (int, float)) and math.isfinite(v)}, step=step)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        texts = [
            self.swanlab.Text(
                f"prompt: {s['prompt']}\nresponse: {s['response']}\nscore: {s['score']}", caption=f"sample {i}"
            )
            for i, s in enumerate(samples)
        ]
        self.swanlab.log({"val/generations": texts}, step=step)

    def finish(self) -> None:
        self.swanlab.finish()


LOGGER_BACKENDS.register(
    "console", lambda ctx: ConsoleLogger(ctx.project_name, ctx.experiment_name, total_steps=ctx.total_steps)
)
LOGGER_BACKENDS.register("file", lambda ctx: FileLogger(ctx.output_dir))
LOGGER_BACKENDS.register("tensorboard", lambda ctx: TensorboardLogger(ctx.output_dir))
LOGGER_BACKENDS.register("wandb", WandbLogger)
LOGGER_BACKENDS.register("tracking", WandbLogger)  # verl's historical alias
LOGGER_BACKENDS.register("mlflow", MlflowLogger)
LOGGER_BACKENDS.register("swanlab", SwanlabLogger)


def _prometheus(ctx: BackendContext) -> LoggerBackend:
    _import_optional("prometheus_client", "prometheus", "prometheus")
    from hybridflow.tracking.prometheus import PrometheusLogger

    return PrometheusLogger(ctx)


LOGGER_BACKENDS.register("prometheus", _prometheus)  # trainer.prometheus.{host,port}: the driver's /metrics
