"""Observability: verl-named metrics, logger backends with a live console bar, and the run report."""

from hybridflow.tracking.loggers import LOGGER_BACKENDS, MissingDependencyError
from hybridflow.tracking.metrics import (
    FlopsCounter,
    compute_data_metrics,
    compute_memory_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    process_validation_metrics,
    reduce_metrics,
)
from hybridflow.tracking.report import load_history, load_samples, write_report
from hybridflow.tracking.tracking import Tracking

__all__ = [
    "Tracking",
    "LOGGER_BACKENDS",
    "MissingDependencyError",
    "FlopsCounter",
    "compute_data_metrics",
    "compute_memory_metrics",
    "compute_rollout_probs_diff_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "process_validation_metrics",
    "reduce_metrics",
    "write_report",
    "load_history",
    "load_samples",
]
