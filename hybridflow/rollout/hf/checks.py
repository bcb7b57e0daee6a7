"""This engine's configuration rules, run by the launch's check pipeline (run stage): keys that act differently on
CPU than verl users expect (the hf engine computes in fp32 there and bounds its KV cache by sequence counts), and
``tensor_model_parallel_size``, which splits the colocated hf engine over that many of the actor's processes
(``rollout/hf/sharded_engine.py``): it must divide them, the model must split that way, and what the split engine
does not build (LoRA, images) is refused."""

from __future__ import annotations

from hybridflow.config.checks.machine import precision_name
from hybridflow.rollout.moe_layout import moe_split_note
from hybridflow.config.checks.parallel import n_devices

__all__ = ["device_errors", "device_notes", "model_errors"]

_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
_EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def _split(cfg) -> int:
    """k when the colocated hf engine is split over k > 1 ranks, else 1."""
    k = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
    if k <= 1 or not cfg.actor_rollout_ref.hybrid_engine or n_devices(cfg) <= 1:
        return 1
    return k


def device_errors(cfg, device: str) -> list[str]:
    k, world = _split(cfg), n_devices(cfg)
    if k == 1:
        return []
    errors = []
    if world % k:
        errors.append(f"{_KEY}={k} must divide the {world} actor/rollout processes (trainer.nnodes x "
                      f"trainer.n_gpus_per_node): the hf engine is split over groups of {k} of them")
    model = cfg.actor_rollout_ref.model
    if int(model.lora_rank) > 0 or model.lora_adapter_path is not None:
        errors.append(f"{_KEY}={k} with LoRA: the split hf engine loads plain weights shard by shard and does not "
                      f"merge adapters; set {_KEY}=1")
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
