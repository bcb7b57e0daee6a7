"""Per-step training metrics over a ``DataProto``, under verl's metric names.

Users compare hybridflow runs with verl runs (and reuse their dashboards), so every name here is
verl's (``critic/score/mean``, ``response_length/clip_ratio``, ``perf/throughput``, ``timing_s/gen``...).
All functions are pure: they read the batch and return ``dict[str, float]``; nothing is logged here.

Validation metrics (``val-core/...``) live in :mod:`hybridflow.tracking.validation_metrics` and the MFU
estimate in :mod:`hybridflow.tracking.flops`; both are re-exported from this module.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking.flops import (
    FlopsCounter,
    estimate_flops,
    get_device_peak_flops,
    measure_cpu_peak_flops,
)
from hybridflow.tracking.validation_metrics import bootstrap_metric, calc_maj_val, process_validation_metrics

__all__ = [
    "compute_data_metrics",
    "compute_timing_metrics",
    "compute_throughput_metrics",
    "compute_memory_metrics",
    "compute_mfu_metrics",
    "compute_rollout_probs_diff_metrics",
    "compute_response_info",
    "reduce_metrics",
    "FlopsCounter",
    "estimate_flops",
    "get_device_peak_flops",
    "measure_cpu_peak_flops",
    "bootstrap_metric",
    "calc_maj_val",
    "process_validation_metrics",
]

# Stages whose per-token time is meaningful, and which tokens they process: generation only
# produces response tokens; the forward/backward stages see prompt + response (as verl).
_RESPONSE_TOKEN_STAGES = ("gen",)
_ALL_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor", "old_log_prob")


def _require(batch: DataProto, *keys: str) -> None:
    missing = [k for k in keys if k not in batch.batch]
    if missing:
        raise KeyError(
            f"Metric computation needs batch tensors {missing}, but the batch only has "
            f"{sorted(batch.batch)}. Run the stage that produces them first (see docs/architecture.md, Batch keys)."
        )


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``{prefix}/mean|max|min``; an empty selection gives 0.0 rather than NaN (e.g. all responses aborted)."""
    values = values.detach().float()
    if values.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_response_info(batch: DataProto) -> dict[str, Any]:
    """Prompt and response lengths per sequence, read from ``attention_mask`` as verl does.

    The response length counts every non-pad response token (tool outputs included), because the
    clip ratio asks "did the sequence hit ``max_response_length``", not "how many tokens are trained on".
    """
    _require(batch, "responses", "attention_mask")
    max_response_length = int(batch.batch["responses"].shape[-1])
    attention_mask = batch.batch["attention_mask"]
    prompt_mask = attention_mask[:, :-max_response_length] if max_response_length else attention_mask
    response_mask = attention_mask[:, -max_response_length:] if max_response_length else attention_mask[:, :0]
    return {
        "max_prompt_length": int(prompt_mask.shape[-1]),
        "max_response_length": max_response_length,
        "prompt_length": prompt_mask.sum(-1).float(),
        "response_length": response_mask.sum(-1).float(),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool, eos_token_ids: Iterable[int] | None = None) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch (verl names).

    * ``critic/score/*``: Σ_t token_level_scores per sequence (the raw reward-function output);
      ``critic/rewards/*``: Σ_t token_level_rewards (after KL-in-reward). Both over non-aborted sequences
      (an aborted rollout has an empty response and no meaningful score).
    * ``critic/advantages|returns|values/*``: token values selected by ``response_mask``.
    * ``critic/vf_explained_var`` = 1 − Var(returns − values) / (Var(returns) + 1e-5) over response tokens
      (how much of the return variance the critic explains; 1 is perfect, ≤ 0 is useless).
    * ``response_length/clip_ratio``: fraction of responses cut by the length limit: the full max response
      length *without* a stop token at the end (with ``eos_token_ids``; a response whose EOS lands exactly on
      the last slot finished on its own). ``prompt_length/clip_ratio``: prompts filling ``max_prompt_length``.
    """
    _require(batch, "token_level_scores", "token_level_rewards", "advantages", "returns", "response_mask")
    info = compute_response_info(batch)
    response_length, prompt_length = info["response_length"], info["prompt_length"]
    response_mask = batch.batch["response_mask"].bool()
    aborted = response_length == 0
    kept = ~aborted

    metrics: dict[str, float] = {}
    metrics |= _stats("critic/score", batch.batch["token_level_scores"].sum(-1)[kept])
    metrics |= _stats("critic/rewards", batch.batch["token_level_rewards"].sum(-1)[kept])
    valid_adv = torch.masked_select(batch.batch["advantages"], response_mask)
    valid_returns = torch.masked_select(batch.batch["returns"], response_mask)
    metrics |= _stats("critic/advantages", valid_adv)
    metrics |= _stats("critic/returns", valid_returns)
    if use_critic:
        _require(batch, "values")
        valid_values = torch.masked_select(batch.batch["values"], response_mask)
        metrics |= _stats("critic/values", valid_values)
        metrics["critic/vf_explained_var"] = _explained_variance(valid_returns, valid_values)

    clipped = _truncated(batch, response_length, info["max_response_length"], eos_token_ids)
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = clipped.float().mean().item() if len(clipped) else 0.0
    metrics |= _stats("response_length_non_aborted", response_length[kept])
    metrics["response_length_non_aborted/clip_ratio"] = clipped[kept].float().mean().item() if bool(kept.any()) else 0.0
    metrics["response/aborted_ratio"] = aborted.float().mean().item() if len(aborted) else 0.0
    metrics |= _stats("prompt_length", prompt_length)
    metrics["prompt_length/clip_ratio"] = _clip_ratio(prompt_length, info["max_prompt_length"])

    for key, name in (("__num_turns__", "num_turns"), ("tool_call_counts", "tool_call_counts")):
        if key in batch.non_tensor_batch:
            values = torch.as_tensor(np.asarray(batch.non_tensor_batch[key], dtype=np.float64))
            metrics |= _stats(name, values)
    return metrics


def _explained_variance(returns: torch.Tensor, values: torch.Tensor) -> float:
    if returns.numel() < 2:  # variance of a single token is undefined
        return 0.0
    return (1.0 - torch.var(returns.float() - values.float()) / (torch.var(returns.float()) + 1e-5)).item()


def _truncated(batch: DataProto, lengths: torch.Tensor, max_length: int, eos_token_ids: Iterable[int] | None) -> torch.Tensor:
    """Per-row bool: the response filled ``max_length`` and its last token is not one of ``eos_token_ids``."""
    full = torch.eq(lengths, max_length)
    eos = [int(t) for t in (eos_token_ids or []) if t is not None]
    if not eos or max_length == 0:
        return full
    last = batch.batch["responses"][:, -1]
    return full & ~torch.isin(last, torch.tensor(eos, dtype=last.dtype, device=last.device))


def _clip_ratio(lengths: torch.Tensor, max_length: int) -> float:
    if lengths.numel() == 0:
        return 0.0
    return torch.eq(lengths, max_length).float().mean().item()


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every timed stage and ``timing_per_token_ms/<stage>`` where it is meaningful.

    Per-token time divides by response tokens for ``gen`` and by prompt+response tokens for the stages that
    run the model over whole sequences, so runs with different lengths can be compared.
    """
    info = compute_response_info(batch)
    n_response = info["response_length"].sum().item()
    n_all = n_response + info["prompt_length"].sum().item()
    tokens = {**{s: n_response for s in _RESPONSE_TOKEN_STAGES}, **{s: n_all for s in _ALL_TOKEN_STAGES}}
    metrics = {f"timing_s/{name}": float(sec) for name, sec in timing_raw.items()}
    for name, sec in timing_raw.items():
        if name in tokens and tokens[name] > 0:
            metrics[f"timing_per_token_ms/{name}"] = float(sec) * 1000.0 / tokens[name]
    return metrics


def compute_throughput_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_devices: int) -> dict[str, float]:
    """verl's throughput: ``perf/throughput`` = Σ(prompt+response tokens) / (step time × devices), tokens/s/device.

    The token count is ``meta_info["global_token_num"]`` when the trainer set it (verl does, per sequence),
    else the attention-mask sum. ``timing_raw["step"]`` is the wall time of the whole step.
    """
    if "step" not in timing_raw:
        raise KeyError(
            f"compute_throughput_metrics needs timing_raw['step'] (the whole step's wall time); got stages "
            f"{sorted(timing_raw)}. Time the step with the key 'step'."
        )
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1 (devices the step ran on), got {n_devices}")
    if "global_token_num" in batch.meta_info:
        total_tokens = float(sum(batch.meta_info["global_token_num"]))
    else:
        _require(batch, "attention_mask")
        total_tokens = batch.batch["attention_mask"].sum().item()
    step_time = float(timing_raw["step"])
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * n_devices) if step_time > 0 else 0.0,
    }


def compute_mfu_metrics(
    batch: DataProto,
    timing_raw: Mapping[str, float],
    counters: Mapping[str, FlopsCounter],
    n_devices: int,
    ppo_epochs: int = 1,
) -> dict[str, float]:
    """``perf/mfu/<role>`` for each role in ``counters`` (``actor``, ``critic``) that has an update timing.

    The update of role r runs ``ppo_epochs`` forward+backward sweeps over every sequence of the batch in
    ``timing_raw["update_<r>"]`` seconds, on ``n_devices`` devices (verl computes the same inside its workers).
    """
    _require(batch, "attention_mask")
    seqlens = batch.batch["attention_mask"].sum(-1).tolist()
    metrics = {}
    for role, counter in counters.items():
        seconds = timing_raw.get(f"update_{role}")
        if seconds is not None and seconds > 0:
            metrics[f"perf/mfu/{role}"] = counter.mfu(seqlens, float(seconds), n_devices=n_devices, passes=ppo_epochs)
    return metrics


def compute_memory_metrics(device: str | torch.device | None = None) -> dict[str, float]:
    """Peak accelerator memory (GiB) on GPU, and this process's resident memory (GiB) always.

    On CPU the interesting number is the process RSS (``perf/cpu_memory_used_gb``): it is what runs out on a
    laptop. verl's ``max_memory_allocated`` / ``max_memory_reserved`` are added when a CUDA device is used.
    """
    import psutil

    gib = float(1024**3)
    metrics = {"perf/cpu_memory_used_gb": psutil.Process().memory_info().rss / gib}
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and torch.cuda.is_available():
        metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(dev) / gib
        metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(dev) / gib
    return metrics


def compute_rollout_probs_diff_metrics(batch: DataProto) -> dict[str, float]:
    """Train/rollout mismatch of a batch (see :func:`hybridflow.algorithms.rollout_correction.rollout_probs_diff`).

    The rollout engine and the training engine compute the same policy with different kernels (and
    precisions); a large gap makes the PPO ratio wrong (see verl's rollout-correction notes). Needs
    ``rollout_log_probs`` (from the engine) and ``old_log_probs`` (recomputed by the actor).
    """
    from hybridflow.algorithms.rollout_correction import rollout_probs_diff

    _require(batch, "rollout_log_probs", "old_log_probs", "response_mask")
    return rollout_probs_diff(batch.batch["rollout_log_probs"], batch.batch["old_log_probs"],
                              batch.batch["response_mask"])


def _reduce_fn(key: str):
    """min/max-named metrics keep their extreme over micro-batches; everything else is averaged (as verl)."""
    leaf = key.rsplit("/", 1)[-1]
    if leaf == "max" or leaf.endswith("_max"):
        return np.max
    if leaf == "min" or leaf.endswith("_min"):
        return np.min
    return np.mean


def reduce_metrics(metrics: Mapping[str, Iterable[float] | float]) -> dict[str, float]:
    """Reduce worker metrics ``name -> list of per-micro-batch values`` to one float per name.

    The mean, except names whose last part is ``max``/``min`` (or ends ``_max``/``_min``), which keep the
    extreme: averaging per-micro-batch maxima would under-report the batch maximum. Scalars pass through.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float, np.number)):
            out[key] = float(value)
            continue
        arr = np.asarray([v.item() if isinstance(v, torch.Tensor) else v for v in value], dtype=np.float64)
        if arr.size == 0:
            raise ValueError(f"Metric '{key}' has no values to reduce; a worker returned an empty list for it.")
        out[key] = float(_reduce_fn(key)(arr))
    return out
