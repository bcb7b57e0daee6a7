"""This engine's configuration rules, run by the launch's check pipeline (run stage): keys that act differently on
CPU than verl users expect (the hf engine computes in fp32 there and bounds its KV cache by sequence counts), and
``tensor_model_parallel_size``, which splits the colocated hf engine over that many of the actor's processes
(``rollout/hf/sharded_engine.py``): it must divide them, the model must split that way, and what the split engine
does not build (images; LoRA with pipeline stages) is refused."""

from __future__ import annotations

from hybridflow.config.checks.machine import precision_name
from hybridflow.rollout.moe_layout import moe_split_note
from hybridflow.config.checks.parallel import n_devices

__all__ = ["device_errors", "device_notes", "exact_problem", "model_errors", "resolve_exact_log_probs"]

_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
_EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def _split(cfg) -> int:
    """k when the colocated hf engine is split over k > 1 ranks, else 1."""
    k = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
    if k <= 1 or not cfg.actor_rollout_ref.hybrid_engine or n_devices(cfg) <= 1:
        return 1
    return k


_FREE_KEY = "actor_rollout_ref.rollout.free_weights_on_sleep"


def device_errors(cfg, device: str) -> list[str]:
    k, world = _split(cfg), n_devices(cfg)
    if k == 1:
        if cfg.actor_rollout_ref.rollout.free_weights_on_sleep:
            return [f"{_FREE_KEY}=true acts on the hf engine split over {_KEY} > 1 ranks (its own weight shard); "
                    "this run's hf engine is whole (it generates with the actor's module, or keeps a copy that "
                    f"delta sync compares against). Remove the key, or set {_KEY} > 1 with several processes"]
        return []
    errors = []
    if world % k:
        errors.append(f"{_KEY}={k} must divide the {world} actor/rollout processes (trainer.nnodes x "
                      f"trainer.n_gpus_per_node): the hf engine is split over groups of {k} of them")
    model, actor = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor
    pp = int(actor.megatron.pipeline_model_parallel_size or 1) if actor.strategy == "megatron" else 1
    if (int(model.lora_rank) > 0 or model.lora_adapter_path is not None) and pp > 1:
        errors.append(f"{_KEY}={k} with LoRA and actor.megatron.pipeline_model_parallel_size={pp}: the split hf "
                      "engine merges the adapters piece by piece as the switch reads them, which every rank must "
                      f"join, and a pipeline stage lacks its peers' layers; set {_KEY}=1 or train without pipeline "
                      "stages")
    return errors


def device_notes(cfg, device: str) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    notes = [note for note in (moe_split_note(rollout, "hf"),) if note]
    if device == "cpu":
        if precision_name(rollout.dtype) not in ("bf16", None):
            notes.append(f"actor_rollout_ref.rollout.dtype={rollout.dtype} has no effect on CPU: the hf rollout "
                         "computes in fp32 there, like the actor")
        if rollout.gpu_memory_utilization != 0.5:
            notes.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} has no "
                         "effect on CPU: the hf KV cache is bounded by rollout.max_num_seqs and max_model_len there")
    k = int(rollout.tensor_model_parallel_size)
    if k > 1 and _split(cfg) == 1:
        where = ("standalone hf replicas (hybrid_engine=false) run one process each" if not
                 cfg.actor_rollout_ref.hybrid_engine else "the run has one actor/rollout process")
        notes.append(f"{_KEY}={k} does not split the hf engine here: {where}, so each engine holds the whole model")
    return notes


def model_errors(cfg) -> list[str]:
    """A split hf engine needs heads, the MLP and the experts to divide by k, and a text-only model."""
    k = _split(cfg)
    if k == 1:
        return []
    from hybridflow.engine.expert_parallel import expert_parallel_problem
    from hybridflow.engine.model_loader import ModelLoadError, load_hf_config
    from hybridflow.engine.tensor_parallel import tensor_parallel_problem
    from hybridflow.engine.transformers_adapter import text_config

    model = cfg.actor_rollout_ref.model
    try:
        config = load_hf_config(model.path, model.trust_remote_code, None, "actor_rollout_ref.model.path")
    except ModelLoadError:
        return []  # the model_files check reports it
    if text_config(config) is not config:
        return [f"{_KEY}={k}: {model.path} is a vision-language model; the split hf engine takes text prompts only, "
                f"set {_KEY}=1"]
    text = text_config(config)
    experts = next((int(getattr(text, key)) for key in _EXPERT_COUNT_KEYS if getattr(text, key, None)), None)
    problem = tensor_parallel_problem(config, k, _KEY) or (expert_parallel_problem(experts, k, _KEY) if experts
                                                           else None)
    return [f"{problem} ({model.path})"] if problem else []


_EXACT = "actor_rollout_ref.rollout.exact_log_probs"


def exact_problem(cfg, device: str) -> str | None:
    """Why this run's rollout log-probs cannot equal the trainer's bit for bit (``engine/batch_invariant.py``), or
    None: CPU fp32, the colocated hf engine unsplit, the actor's rows whole on one rank (no sp / tp / pp), a text
    model whose layers have batch-invariant kernels."""
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
    if arr.actor.use_prefix_grouper:
        return ("actor.use_prefix_grouper=true: the trainer computes a group's shared prompt once and its responses "
                "after it, a layout the rollout's batched rows do not share")
    if not arr.hybrid_engine:
        return ("standalone rollout replicas (hybrid_engine=false) compute with their own copy of the model, whose "
                "prefill was measured one float32 ulp off the trainer's on some rows; exact agreement holds for the "
                "colocated engine only")
    if _split(cfg) > 1:
        return (f"{_KEY}={_split(cfg)}: the split hf engine sums its row-parallel products over ranks, an order the "
                "one-rank trainer does not share")
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
