"""``trainer.logger=[...,prometheus]``: the run's metrics on an HTTP ``/metrics`` endpoint of the driver, for a
cluster's Prometheus to scrape while the run lives (``prometheus_client``; ``pip install hybridflow[prometheus]``).

Served at ``http://trainer.prometheus.host:trainer.prometheus.port/metrics`` (127.0.0.1:9464 by default: loopback;
``host=0.0.0.0`` lets a Prometheus on another node scrape it; ``port=0`` takes a free port, printed at start).
Every series carries the labels ``run`` (``<project_name>/<experiment_name>``) and ``worker`` (``driver``: the
process that logs the step's aggregated metrics); the gauges also carry ``step`` (the step they describe; only the
latest step's series is kept, so a long run does not grow the page). Counters have no ``step`` label: a counter's
series must live across steps for ``rate()`` to work.

* counters: ``hybridflow_samples_total`` (trajectories trained: ``data.train_batch_size x rollout.n`` a step),
  ``hybridflow_tokens_total`` (prompt + response tokens, verl's ``perf/total_num_tokens``),
  ``hybridflow_failures_total{kind}`` (``agent_loop``: trajectories whose loop raised; ``reward_error`` /
  ``reward_timeout``: samples that could not be scored; ``tool``: tool calls that raised, timed out or returned
  garbage), ``hybridflow_drift_steps_total`` (steps whose rollout and actor token probabilities differed by more
  than ``trainer.prometheus.drift_threshold``, ``training/rollout_probs_diff_max``);
* gauges: ``hybridflow_step``, ``hybridflow_memory_gib{kind}`` (``cpu_rss``, ``gpu_allocated``, ``gpu_reserved``),
  ``hybridflow_staleness{stat}`` (weight versions between the policy that sampled and the one trained: async
  training's ``training/staleness/{mean,max}``, 0 for synchronous steps), ``hybridflow_logprob_drift{stat}``
  (``training/rollout_probs_diff_{mean,max}``), and ``hybridflow_metric{name}``: every numeric metric of the step
  under its verl name.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

__all__ = ["PrometheusLogger"]

_FAILURES = (("agent_loop", ("agent/error_count",)), ("reward_error", ("reward/error_count",)),
             ("reward_timeout", ("reward/timeout_count",)),
             ("tool", ("agent/tool_errors/tool_exception", "agent/tool_errors/timeout", "agent/tool_errors/bad_return")))
_MEMORY = (("cpu_rss", "perf/cpu_memory_used_gb"), ("gpu_allocated", "perf/max_memory_allocated_gb"),
           ("gpu_reserved", "perf/max_memory_reserved_gb"))


def _settings(config: Mapping[str, Any]) -> dict[str, Any]:
    trainer = config.get("trainer", {}) if isinstance(config, Mapping) else {}
    prom = trainer.get("prometheus", {}) if isinstance(trainer, Mapping) else {}
    return {"host": prom.get("host", "127.0.0.1"), "port": int(prom.get("port", 9464)),
            "drift_threshold": float(prom.get("drift_threshold", 0.1))}


def _samples_per_step(config: Mapping[str, Any]) -> int | None:
    try:
        return int(config["data"]["train_batch_size"]) * int(config["actor_rollout_ref"]["rollout"]["n"])
    except (KeyError, TypeError, ValueError):
        return None


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class PrometheusLogger:
    """A logger backend (``log`` / ``log_generations`` / ``finish``) that updates its registry on every ``log`` and
    serves it over HTTP from a daemon thread until ``finish``."""

    def __init__(self, ctx):
        import prometheus_client as prom  # installed: loggers._prometheus checked, naming the extra otherwise

        settings = _settings(ctx.config)
        self.run = f"{ctx.project_name}/{ctx.experiment_name}"
        self.drift_threshold = settings["drift_threshold"]
        self.samples_per_step = _samples_per_step(ctx.config)
        self.registry = prom.CollectorRegistry(auto_describe=True)
        self._build_series(prom)
        self._gauge_labels: list[tuple[Any, tuple[str, ...]]] = []
        self._gauge_step: int | None = None
        try:
            self.server, self._thread = prom.start_http_server(settings["port"], addr=settings["host"],
                                                               registry=self.registry)
        except OSError as e:
            raise RuntimeError(f"the prometheus logger cannot listen on {settings['host']}:{settings['port']} "
                               f"({e.strerror or e}); set trainer.prometheus.port to a free port (0: any) or "
                               "trainer.prometheus.host") from None
        self.host, self.port = settings["host"], self.server.server_port
        shown = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{shown}:{self.port}/metrics"
        print(f"hybridflow: Prometheus metrics of {self.run} at {self.url}", flush=True)

    def _build_series(self, prom) -> None:
        base, reg = ("run", "worker"), self.registry
        self.samples = prom.Counter("hybridflow_samples", "trajectories trained", base, registry=reg)
        self.tokens = prom.Counter("hybridflow_tokens", "prompt + response tokens of the trained steps", base,
                                   registry=reg)
        self.failures = prom.Counter("hybridflow_failures", "failed trajectories, rewards and tool calls",
                                     (*base, "kind"), registry=reg)
        self.drift = prom.Counter("hybridflow_drift_steps", "steps whose rollout vs actor token probabilities "
                                  "differed by more than trainer.prometheus.drift_threshold", base, registry=reg)
        gauge = (*base, "step")
        self.step = prom.Gauge("hybridflow_step", "the latest logged step", base, registry=reg)
        self.memory = prom.Gauge("hybridflow_memory_gib", "memory of the step, GiB", (*gauge, "kind"), registry=reg)
        self.staleness = prom.Gauge("hybridflow_staleness", "weight versions between sampling and training",
                                    (*gauge, "stat"), registry=reg)
        self.logprob_drift = prom.Gauge("hybridflow_logprob_drift", "rollout vs actor token probability gap",
                                        (*gauge, "stat"), registry=reg)
        self.metric = prom.Gauge("hybridflow_metric", "a step's metric under its verl name", (*gauge, "name"),
                                 registry=reg)
        for kind, _ in _FAILURES:  # present (at 0) from the start, so rate() and alerts see them before a failure
            self.failures.labels(self.run, "driver", kind)
        for counter in (self.samples, self.tokens, self.drift):
            counter.labels(self.run, "driver")

    def _set_gauge(self, gauge, labels: tuple[str, ...], value: float) -> None:
        gauge.labels(*labels).set(value)
        if (gauge, labels) not in self._gauge_labels:
            self._gauge_labels.append((gauge, labels))

    def log(self, data: Mapping[str, Any], step: int) -> None:
        run, worker = self.run, "driver"
        if int(step) != self._gauge_step:  # the previous step's series go: one step on the page at a time
            for gauge, old in self._gauge_labels:
                gauge.remove(*old)
            self._gauge_labels, self._gauge_step = [], int(step)
        labels = (run, worker, str(int(step)))
        self.step.labels(run, worker).set(int(step))
        training_step = "timing_s/step" in data or "perf/total_num_tokens" in data
        if training_step and self.samples_per_step:
            self.samples.labels(run, worker).inc(self.samples_per_step)
        tokens = _number(data, "perf/total_num_tokens")
        if tokens:
            self.tokens.labels(run, worker).inc(tokens)
        for kind, keys in _FAILURES:
            count = sum(_number(data, k) or 0.0 for k in keys)
            if count > 0:
                self.failures.labels(run, worker, kind).inc(count)
        gap_max = _number(data, "training/rollout_probs_diff_max")
        if gap_max is not None and gap_max > self.drift_threshold:
            self.drift.labels(run, worker).inc()
        for kind, key in _MEMORY:
            if (value := _number(data, key)) is not None:
                self._set_gauge(self.memory, (*labels, kind), value)
        for stat in ("mean", "max"):
            stale = _number(data, f"training/staleness/{stat}")
            if training_step or stale is not None:
                self._set_gauge(self.staleness, (*labels, stat), stale or 0.0)
            if (gap := _number(data, f"training/rollout_probs_diff_{stat}")) is not None:
                self._set_gauge(self.logprob_drift, (*labels, stat), gap)
        for name in data:
            if (value := _number(data, name)) is not None:
                self._set_gauge(self.metric, (*labels, name), value)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        return  # sample texts are not metrics

    def finish(self) -> None:
        server = getattr(self, "server", None)
        if server is not None:
            server.shutdown()
            server.server_close()
            self.server = None
