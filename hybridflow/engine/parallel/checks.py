"""This floor's configuration rules for ``strategy=megatron`` roles, run by the launch's check pipeline: the sizes
fit the role's devices (config stage) and the model can be split as asked (run stage: tp divides its heads and MLP,
ep its experts; reads ``config.json`` only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.config.checks.megatron import megatron_roles, without_echoes
from hybridflow.config.checks.parallel import n_devices
from hybridflow.engine.expert_parallel import expert_parallel_problem
from hybridflow.engine.model_loader import ModelLoadError, load_hf_config
from hybridflow.engine.parallel.pipeline import PipelineError, stage_layer_ranges
from hybridflow.engine.parallel.parallelize import pipeline_spec_for
from hybridflow.engine.parallel_dims import ParallelDims, ParallelDimsError, role_layout
from hybridflow.engine.tensor_parallel import tensor_parallel_problem
from hybridflow.engine.transformers_adapter import text_config

if TYPE_CHECKING:
    from hybridflow.config.schema import PPOConfig

__all__ = ["check_parallel_layout", "check_parallel_model"]


def check_parallel_layout(cfg: PPOConfig, errors: list[str]) -> None:
    """Config stage: each megatron role's sizes against its devices -- world = dp x sp x tp, ep divides dp or is
    k x sp x tp with k dividing dp (ParallelDims' own rules). Skipped when a size was already refused."""
    if any(".megatron." in e for e in errors):
        return
    found: list[str] = []
    world = n_devices(cfg)
    for prefix, node, _ in megatron_roles(cfg):
        if node.strategy != "megatron" or (prefix == "critic" and not cfg.use_critic):
            continue
        try:
            ParallelDims.for_role(world, node, prefix)
        except ParallelDimsError as e:
            where = ("the local backend runs one process" if cfg.trainer.backend == "local"
                     else f"trainer.nnodes x trainer.n_gpus_per_node = {world} devices")
            found.append(f"{e} ({where})")
    errors.extend(without_echoes(found))


_EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def check_parallel_model(cfg: PPOConfig, errors: list[str]) -> None:
    """Run stage: the model can be split as asked -- tp divides its attention and key/value heads and the MLP's
    intermediate size, ep its experts, the pipeline's stages (pp x vpp, the first / last stage sizes) its decoder
    layers (the engine's own rules; reads ``config.json`` only)."""
    found: list[str] = []
    for prefix, node, _ in megatron_roles(cfg):
        if node.strategy != "megatron" or (prefix == "critic" and not cfg.use_critic):
            continue
        layout = role_layout(node)
        tp, ep = layout["tp"], layout["ep"]
        if tp <= 1 and ep <= 1 and layout["pp"] <= 1:
            continue
        model = cfg.critic.model if prefix == "critic" else cfg.actor_rollout_ref.model
        field = "critic.model.path" if prefix == "critic" else "actor_rollout_ref.model.path"
        try:
            config = load_hf_config(model.path, model.trust_remote_code, None, field)
        except ModelLoadError:
            continue  # check_model_files reports it
        problem = tensor_parallel_problem(config, tp, f"{prefix}.megatron.tensor_model_parallel_size")
        text = text_config(config)
        experts = next((int(getattr(text, k)) for k in _EXPERT_COUNT_KEYS if getattr(text, k, None)), None)
        problem = problem or expert_parallel_problem(experts, ep, f"{prefix}.megatron.expert_model_parallel_size")
        problem = problem or _pipeline_problem(node, text, layout, f"{prefix}.megatron.pipeline_model_parallel_size")
        if problem:
            found.append(f"{problem} ({model.path})")
    errors.extend(without_echoes(found))


def _pipeline_problem(node, text, layout: dict[str, int], key: str) -> str | None:
    """Why the decoder layers cannot be split into the role's pipeline stages (``None`` when they can)."""
    spec = pipeline_spec_for(node)
    layers = getattr(text, "num_hidden_layers", None)
    if spec is None or layers is None:
        return None
    try:
        stage_layer_ranges(int(layers), layout["pp"] * layout["vpp"], spec.first, spec.last, key)
    except PipelineError as e:
        return str(e)
    return None
