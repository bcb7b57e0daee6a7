"""verl's Megatron keys on the torch-native N-D engine (``<role>.strategy=megatron``).

verl selects its Megatron-LM backend three ways -- ``--config-name=ppo_megatron_trainer`` (the loader turns it into
``strategy=megatron`` on the actor, reference and critic), ``<role>.strategy=megatron``, and verl 0.9's
``model_engine=megatron`` (written into the three strategies here).  A role on that strategy trains with the same
FSDP2 engine as ``fsdp2``, laid out by its ``megatron`` node:

* ``tensor_model_parallel_size`` / ``expert_model_parallel_size``: the tp / ep dimensions of the role's mesh
  (``engine/parallel_dims.py``; tp splits heads, MLP columns and the vocabulary, ep the MoE experts -- over
  data-parallel ranks, or over whole dp x cp x tp blocks when ep does not divide dp, as Megatron lays them out);
  LoRA adapters follow the tensor-parallel split of their projections;
* ``context_parallel_size``: runs as Ulysses sequence parallelism over that many ranks (written into
  ``<role>.ulysses_sequence_parallel_size``; an explicit, different Ulysses size is a conflict);
* ``param_offload`` / ``optimizer_offload``: written into the role's ``fsdp_config`` (the engine moves parameters /
  Adam moments to the CPU between phases);
* ``pipeline_model_parallel_size`` / ``virtual_pipeline_model_parallel_size``: the pp dimension (decoder layers cut
  into ``pp x vpp`` stages, interleaved over the pp ranks; ``engine/parallel/pipeline.py``), with
  ``override_transformer_config.num_layers_in_{first,last}_pipeline_stage`` fixing the end stages' layers and
  ``pipeline_schedule`` (hybridflow's: ``1f1b`` | ``gpipe``; with virtual stages interleaved 1F1B or looped GPipe);
* ``expert_tensor_parallel_size``: experts are never split by tensor parallelism, so only 1 (or null) is
  accepted; ``use_distributed_optimizer=false`` is refused (FSDP2 always shards the optimizer state over the data
  ranks).

The remaining keys of the node are Megatron-LM internals: ``key_policy`` lists them as inert or refused.
The keys of a role on another strategy must stay at their defaults (they would silently do nothing).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PIPELINE_SCHEDULES", "check_megatron", "megatron_roles", "pipeline_split", "without_echoes"]

_ENGINES = ("dp", "fsdp", "megatron")
_DEFAULTS = {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 1, "expert_tensor_parallel_size": None,
             "pipeline_model_parallel_size": 1, "virtual_pipeline_model_parallel_size": None,
             "pipeline_schedule": "1f1b", "context_parallel_size": 1, "param_offload": False,
             "optimizer_offload": False, "use_distributed_optimizer": True}


def megatron_roles(cfg: Any) -> list[tuple[str, Any, Any]]:
    """``(key prefix, role node, its fsdp_config)`` of the roles that have a ``megatron`` node."""
    arr = cfg.actor_rollout_ref
    return [("actor_rollout_ref.actor", arr.actor, arr.actor.fsdp_config),
            ("actor_rollout_ref.ref", arr.ref, arr.ref.fsdp_config),
            ("critic", cfg.critic, cfg.critic.model.fsdp_config)]


def _engine_choice(cfg: Any, errors: list[str], notes: list[str]) -> None:
    engine = str(cfg.model_engine)
    if engine not in _ENGINES:
        errors.append(f"model_engine={engine}: verl's {engine} training engine is not available here. Use "
                      "model_engine=dp (FSDP2), model_engine=veomni (FSDP2 laid out by the *.veomni.* keys) or "
                      "model_engine=megatron (FSDP2 laid out by the *.megatron.* keys: tensor, expert, pipeline and "
                      "context parallelism)")
    elif engine == "megatron":
        for prefix, node, _ in megatron_roles(cfg):
            node.strategy = "megatron"
        notes.append("model_engine=megatron: the actor, reference and critic use strategy=megatron (the torch-native "
                     "N-D engine laid out by their megatron nodes)")


def _stray_keys(prefix: str, node: Any, notes: list[str]) -> None:
    """A megatron node on a role of another strategy is not read -- verl ignores it too (its FSDP workers never look at
    it), so it is accepted and said."""
    changed = [k for k, v in _DEFAULTS.items() if getattr(node.megatron, k) != v]
    if changed:
        notes.append(f"{', '.join(f'{prefix}.megatron.{k}' for k in changed)} has no effect: the megatron node is "
                     f"read only with {prefix}.strategy=megatron (this role has strategy={node.strategy}; verl ignores "
                     "it too). Set the strategy (or model_engine=megatron) to use it")


def _layout(prefix: str, node: Any, fsdp: Any, lora: bool, errors: list[str], notes: list[str]) -> None:
    m = node.megatron
    key = f"{prefix}.megatron"
    _pipeline_keys(key, m, errors)
    etp = m.expert_tensor_parallel_size
    if etp is not None and int(etp) != 1:
        errors.append(f"{key}.expert_tensor_parallel_size={etp}: experts are split over "
                      f"{key}.expert_model_parallel_size only (whose groups may take in the tensor-parallel ranks) and "
                      "no expert is split by tensor parallelism; set it to 1 (or null)")
    if not m.use_distributed_optimizer:
        errors.append(f"{key}.use_distributed_optimizer=false: a replicated optimizer is not offered; FSDP2 shards "
                      "parameters, gradients and the optimizer state over the data-parallel ranks (what verl's "
                      "default true means). Drop the key")
    cp = int(m.context_parallel_size or 1)
    if cp < 1:
        errors.append(f"{key}.context_parallel_size={cp}: must be >= 1")
    elif cp > 1:
        sp = int(node.ulysses_sequence_parallel_size or 1)
        if sp not in (1, cp):
            errors.append(f"{key}.context_parallel_size={cp} and {prefix}.ulysses_sequence_parallel_size={sp} both "
                          "split the sequence: context parallelism runs as Ulysses here, so set only one of them")
        else:
            node.ulysses_sequence_parallel_size = cp
            notes.append(f"{key}.context_parallel_size={cp} runs as Ulysses sequence parallelism over {cp} ranks "
                         f"({prefix}.ulysses_sequence_parallel_size={cp})")
    for name in ("param_offload", "optimizer_offload"):
        if getattr(m, name) and not getattr(fsdp, name):
            setattr(fsdp, name, True)
    if int(m.tensor_model_parallel_size) > 1 and lora:
        notes.append(f"{key}.tensor_model_parallel_size={m.tensor_model_parallel_size} with LoRA: each adapter follows "
                     "its projection's split (column-wise: B split, A whole; row-wise: A split, B whole); adapters on "
                     "the embedding, the LM head or MoE experts are refused when the model is split")


_DECAY_STYLES = {"constant": "constant", "cosine": "cosine"}


def _optimizer_keys(cfg: Any, errors: list[str], notes: list[str]) -> None:
    """Megatron's spelling of the schedule (verl's optim/megatron.yaml) into the keys the engine reads, and its
    OptimizerConfig fields out of override_optimizer_config (config/checks/megatron_optim.py)."""
    from hybridflow.config.checks.megatron_optim import megatron_optimizer_overrides

    for key, optim, fsdp in (("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim,
                              cfg.actor_rollout_ref.actor.fsdp_config),
                             ("critic.optim", cfg.critic.optim, cfg.critic.model.fsdp_config)):
        megatron_optimizer_overrides(f"{key}.override_optimizer_config", optim, fsdp, errors, notes)
        style = optim.lr_decay_style
        if style is not None:
            if str(style) not in _DECAY_STYLES:
                errors.append(f"{key}.lr_decay_style={style}: only constant and cosine schedules are built "
                              f"({key}.lr_scheduler_type); choose one of them")
            else:
                optim.lr_scheduler_type = _DECAY_STYLES[str(style)]
                notes.append(f"{key}.lr_decay_style={style} is used as {key}.lr_scheduler_type={style}")
        if optim.min_lr is not None:
            if float(optim.lr) <= 0:
                errors.append(f"{key}.min_lr={optim.min_lr} needs {key}.lr > 0 (the floor is min_lr / lr of it)")
            else:
                optim.min_lr_ratio = float(optim.min_lr) / float(optim.lr)
                notes.append(f"{key}.min_lr={optim.min_lr} is used as {key}.min_lr_ratio={optim.min_lr_ratio:.6g}")


def check_megatron(cfg: Any, errors: list[str], notes: list[str]) -> None:
    """Stage-1 check (runs before the strategies, Ulysses and batch-size checks, which read what it writes)."""
    _engine_choice(cfg, errors, notes)
    _optimizer_keys(cfg, errors, notes)
    lora = int(cfg.actor_rollout_ref.model.lora_rank) > 0 or cfg.actor_rollout_ref.model.lora_adapter_path is not None
    found: list[str] = []
    for prefix, node, fsdp in megatron_roles(cfg):
        if node.strategy != "megatron":
            _stray_keys(prefix, node, notes)
            continue
        _layout(prefix, node, fsdp, lora and prefix == "actor_rollout_ref.actor", found, notes)
    errors.extend(without_echoes(found))
    _pipeline_and_router_loss(cfg, errors, notes)


def _pipeline_and_router_loss(cfg: Any, errors: list[str], notes: list[str]) -> None:
    """The actor's MoE router auxiliary loss adds every router's term to the loss; with pipeline stages the routers
    live on several ranks and their terms are not carried to the last stage's loss: refused.  (The expert-load
    metrics ``actor/moe/*`` are not logged with pipeline stages: docs/parallelism.md.)"""
    actor = cfg.actor_rollout_ref.actor
    if actor.strategy != "megatron" or int(actor.megatron.pipeline_model_parallel_size or 1) <= 1:
        return
    key = "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"
    if (cfg.actor_rollout_ref.model.override_config or {}).get("output_router_logits"):
        errors.append(f"actor_rollout_ref.model.override_config.output_router_logits=true with {key}="
                      f"{actor.megatron.pipeline_model_parallel_size}: the router auxiliary loss of pipeline stages "
                      "is not built (each stage's routers would have to add their term to the last stage's loss); "
                      "drop output_router_logits (verl's GRPO launches train MoE models without it) or set the "
                      "pipeline size to 1")


def without_echoes(found: list[str]) -> list[str]:
    """The reference's megatron sizes follow the actor's (as in verl): a problem it only inherits is said once, for
    the actor."""
    actor, ref = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
    return [e for e in found if not (ref in e and e.replace(ref, actor) in found)]




PIPELINE_SCHEDULES = ("1f1b", "gpipe")
PIPELINE_SPLIT_KEYS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")


def _pipeline_keys(key: str, m: Any, errors: list[str]) -> None:
    """The pipeline sizes, verl's stage-split keys and the schedule (the model's layer count is the run stage's)."""
    pp, vpp = int(m.pipeline_model_parallel_size or 1), m.virtual_pipeline_model_parallel_size
    if pp < 1:
        errors.append(f"{key}.pipeline_model_parallel_size={pp}: must be >= 1")
    if vpp is not None and int(vpp) < 1:
        errors.append(f"{key}.virtual_pipeline_model_parallel_size={vpp}: must be >= 1 (or null)")
    elif vpp is not None and int(vpp) > 1 and pp == 1:
        errors.append(f"{key}.virtual_pipeline_model_parallel_size={vpp} interleaves stages over the pipeline ranks: it "
                      f"needs {key}.pipeline_model_parallel_size > 1")
    if m.pipeline_schedule not in PIPELINE_SCHEDULES:
        errors.append(f"{key}.pipeline_schedule={m.pipeline_schedule!r}: choose one of {', '.join(PIPELINE_SCHEDULES)} "
                      "(with virtual stages: interleaved 1F1B, or gpipe's order over the virtual stages)")
    for name in PIPELINE_SPLIT_KEYS:
        value = (m.override_transformer_config or {}).get(name)
        if value is not None and (pp == 1 or int(value) < 1):
            errors.append(f"{key}.override_transformer_config.{name}={value}: " + (
                "a pipeline stage needs at least one layer" if pp > 1 else
                f"it places layers on pipeline stages; set {key}.pipeline_model_parallel_size > 1 or drop it"))


def pipeline_split(node: Any) -> tuple[int | None, int | None]:
    """verl's ``num_layers_in_{first,last}_pipeline_stage`` of a role's megatron node (``None``: split evenly)."""
    over = getattr(node.megatron, "override_transformer_config", None) or {}
    return tuple(int(over[n]) if over.get(n) is not None else None for n in PIPELINE_SPLIT_KEYS)
