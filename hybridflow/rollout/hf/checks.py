"""This engine's configuration rules, run by the launch's check pipeline (run stage): keys that act differently on
CPU than verl users expect (the hf engine computes in fp32 there and bounds its KV cache by sequence counts)."""

from __future__ import annotations

from hybridflow.config.checks.machine import precision_name

__all__ = ["device_errors", "device_notes", "exact_problem", "model_errors", "resolve_exact_log_probs"]


def device_errors(cfg, device: str) -> list[str]:
    return []


def device_notes(cfg, device: str) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    notes = []
    if device == "cpu":
        if precision_name(rollout.dtype) not in ("bf16", None):
            notes.append(f"actor_rollout_ref.rollout.dtype={rollout.dtype} has no effect on CPU: the hf rollout "
                         "computes in fp32 there, like the actor")
        if rollout.gpu_memory_utilization != 0.5:
            notes.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} has no "
                         "effect on CPU: the hf KV cache is bounded by rollout.max_num_seqs and max_model_len there")
    return notes


def model_errors(cfg) -> list[str]:
    return []


_EXACT = "actor_rollout_ref.rollout.exact_log_probs"


def exact_problem(cfg, device: str) -> str | None:
    """Why this run's rollout log-probs cannot equal the trainer's bit for bit (``engine/batch_invariant.py``), or
    None: CPU fp32, the hf engine, the actor's rows whole on one rank (no sp / tp / pp), a text model whose layers
    have batch-invariant kernels."""
    from hybridflow.engine.batch_invariant import config_problem
    from hybridflow.engine.model_loader import ModelLoadError, load_hf_config
    from hybridflow.engine.parallel_dims import role_layout
    from hybridflow.engine.vision import is_vision_language_config

    arr = cfg.actor_rollout_ref
    if arr.rollout.name != "hf":
        return f"rollout.name={arr.rollout.name} (the hf engine runs the batch-invariant kernels)"
    if device != "cpu":
        return (f"the device is {device}: MKL's strict mode makes CPU products batch-invariant; on GPU it takes "
                "batch-invariant GPU kernels (benchmarks/gpu/check_batch_invariance.py)")
    param_dtype = arr.actor.fsdp_config.mixed_precision.param_dtype  # on CPU the only key that makes it compute bf16
    if param_dtype is not None and precision_name(param_dtype) != "fp32":
        return f"actor.fsdp_config.mixed_precision.param_dtype={param_dtype} (exact log-probs are fp32)"
    layout = role_layout(arr.actor)
    split = {k: v for k, v in layout.items() if k in ("sp", "tp", "pp") and v > 1}
    if split:
        return f"the actor's rows are split over ranks ({', '.join(f'{k}={v}' for k, v in split.items())})"
    model = arr.model
    try:
        config = load_hf_config(model.path, model.trust_remote_code, None, "actor_rollout_ref.model.path")
    except ModelLoadError:
        return None  # model_files reports it
    if is_vision_language_config(config):
        return "a vision-language model (its vision tower is not batch-invariant)"
    return config_problem(config)


def resolve_exact_log_probs(cfg, errors: list[str], notes: list[str], ctx) -> None:
    """``exact_log_probs=null`` (the default): on where :func:`exact_problem` finds nothing, and then the rollout keeps
    its log-probs (``calculate_log_probs``: they are pi_old); ``true`` where it cannot act is an error naming why."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.exact_log_probs is False:
        return
    problem = exact_problem(cfg, ctx.device)
    if rollout.exact_log_probs is None:
        rollout.exact_log_probs = problem is None
        if problem is None:
            rollout.calculate_log_probs = True
        return
    if problem is not None:
        errors.append(f"{_EXACT}=true: the rollout's log-probs cannot equal the trainer's bit for bit here: {problem}. "
                      f"Set {_EXACT}=false (or leave it unset: exact where it can be)")
