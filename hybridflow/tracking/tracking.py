"""``Tracking``: the trainer's one logging object, fanning every metric dict out to the chosen backends.

It normalises values once (0-d tensors and numpy scalars become Python numbers; a list or tensor with many
elements is an error that says to reduce it) so that every backend receives the same plain dict, and keeps
the history in memory so the end-of-run report can be written even without the ``file`` backend.
"""

from __future__ import annotations

import dataclasses
import numbers
from pathlib import Path
from typing import Any, Mapping, Sequence

from hybridflow.tracking.loggers import LOGGER_BACKENDS, BackendContext, LoggerBackend

__all__ = ["Tracking", "normalize_metrics", "normalize_samples"]


def _scalar(key: str, value: Any) -> int | float | str:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (numbers.Integral,)):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return value
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    n = size() if callable(size) else size
    if n == 1 and hasattr(value, "item"):  # torch 0-d/1-element tensors, numpy scalars and 1-element arrays
        return _scalar(key, value.item())
    raise TypeError(
        f"Metric '{key}' has a {type(value).__name__} value; log one number per metric per step "
        f"(reduce lists of per-micro-batch values with hybridflow.tracking.metrics.reduce_metrics)."
    )


def normalize_metrics(data: Mapping[str, Any]) -> dict[str, int | float | str]:
    """Plain Python numbers (and strings) for every metric, in the caller's order."""
    return {str(k): _scalar(str(k), v) for k, v in data.items()}


def normalize_samples(samples: Sequence[Any]) -> list[dict[str, Any]]:
    """Samples as dicts with ``prompt``, ``response``, ``score`` (+ any extra keys); verl's (input, output, score)
    tuples are accepted too."""
    out = []
    for i, s in enumerate(samples):
        if isinstance(s, Mapping):
            missing = [k for k in ("prompt", "response") if k not in s]
            if missing:
                raise KeyError(
                    f"Generation sample {i} lacks {missing}; give dicts with 'prompt', 'response' and 'score'."
                )
            d = dict(s)
        elif isinstance(s, (tuple, list)) and len(s) == 3:
            d = {"prompt": s[0], "response": s[1], "score": s[2]}
        else:
            raise TypeError(
                f"Generation sample {i} is a {type(s).__name__}; give a dict with 'prompt', 'response', 'score' "
                "or a (prompt, response, score) tuple."
            )
        d["prompt"], d["response"] = str(d["prompt"]), str(d["response"])
        score = d.get("score")
        d["score"] = None if score is None else _scalar(f"sample {i} score", score)
        out.append(d)
    return out


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"Tracking config must be a dict or a dataclass instance, got {type(config).__name__}")


class Tracking:
    """Log metrics and sample generations to every backend in ``default_backend``.

    ``default_backend`` takes verl's ``trainer.logger`` value (a list, or one name). ``output_dir`` is where
    file-based backends write (metrics.jsonl, tensorboard events, offline wandb/swanlab runs); it defaults to
    ``outputs/<project_name>/<experiment_name>``. ``total_steps`` gives the console bar its length and ETA.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        default_backend: Sequence[str] | str = "console",
        config: Any = None,
        output_dir: str | Path | None = None,
        total_steps: int | None = None,
    ):
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        unknown = [n for n in names if n not in LOGGER_BACKENDS]
        if unknown:
            raise ValueError(
                f"trainer.logger has unknown backend(s) {unknown}: " + LOGGER_BACKENDS.unknown_message(unknown[0])
            )
        self.project_name, self.experiment_name = project_name, experiment_name
        default_dir = Path("outputs") / project_name / experiment_name
        self.output_dir = Path(output_dir) if output_dir is not None else default_dir
        ctx = BackendContext(project_name, experiment_name, self.output_dir, _config_dict(config), total_steps)
        self.backend_names = list(dict.fromkeys("wandb" if n == "tracking" else n for n in names))
        self.loggers: dict[str, LoggerBackend] = {}
        try:
            for name in self.backend_names:
                self.loggers[name] = LOGGER_BACKENDS.get(name)(ctx)
        except BaseException:
            self.finish()  # close what was already opened before re-raising
            raise
        self.history: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self._finished = False

    def set_total_steps(self, total_steps: int) -> None:
        """Known only after the dataloader is built: give the console bar its length."""
        for backend in self.loggers.values():
            setter = getattr(backend, "set_total_steps", None)
            if setter is not None:
                setter(total_steps)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        record = normalize_metrics(data)
        self.history.append({"step": int(step), **record})
        for backend in self.loggers.values():
            backend.log(record, step=int(step))

    def log_generations(self, samples: Sequence[Any], step: int) -> None:
        normalized = normalize_samples(samples)
        self.samples.extend({"step": int(step), **s} for s in normalized)
        for backend in self.loggers.values():
            backend.log_generations(normalized, step=int(step))

    def finish(self) -> None:
        """Close every backend (idempotent); called by the trainer at the end, or by ``with Tracking(...)``."""
        if getattr(self, "_finished", False):
            return
        self._finished = True
        errors = []
        for name, backend in self.loggers.items():
            try:
                backend.finish()
            except Exception as e:  # one backend failing to close must not stop the others from flushing
                errors.append(f"{name}: {e!r}")
        if errors:
            raise RuntimeError("Some loggers failed to finish: " + "; ".join(errors))

    def __enter__(self) -> "Tracking":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
