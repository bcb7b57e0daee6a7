"""verl 0.9's other training engines, laid onto the one engine here (FSDP2; the N-D ``megatron`` strategy when a
layout needs expert, tensor or pipeline parallelism).

verl picks an engine per role in four ways; each is turned into ``<role>.strategy`` plus the keys the engine reads,
before the Megatron check (which lays ``strategy=megatron`` roles out) and the strategy check run:

* ``<role>.model_engine`` (``actor_rollout_ref.actor.model_engine=megatron`` in verl's router-replay and scaling
  scripts) and the defaults-list choice ``actor@actor_rollout_ref.actor=<engine>_actor`` (the loader writes it into
  ``model_engine``): ``dp`` -> fsdp, ``megatron`` -> megatron, ``veomni`` -> veomni (below), ``mlite`` (Megatron Lite)
  -> megatron laid out by the role's ``engine`` node;
* ``model_engine=veomni`` or ``<role>.strategy=veomni`` (VeOmni): the role's ``veomni`` node -- param / optimizer
  offload, ``enable_fsdp_offload`` (FSDP2's CPU offload), ``fsdp_size`` (HSDP group), ``enable_full_shard``
  (reshard after forward), ``forward_prefetch``, ``seed``, ``mixed_precision`` -> ``fsdp_config``;
  ``ulysses_parallel_size`` -> Ulysses; ``expert_parallel_size`` > 1 puts the role on the N-D engine with that expert
  parallelism; its kernel choices (``*_implementation``) are inert;
* ``<role>.strategy=fsdp_turbo`` (FSDP-Turbo): ``fsdp_config.turbo_config.distributed`` --
  ``fully_shard_parallel_size`` -> ``fsdp_size``, ``ulysses_parallel_size`` -> Ulysses, ``expert_parallel_size`` -> the
  N-D engine's experts -- and ``memory.recompute`` -> gradient checkpointing; its module-glob plans (which modules
  FSDP wraps, hooks and recomputes) are inert: FSDP2 wraps and recomputes every decoder layer here;
* Megatron Lite's ``engine`` node (``tp pp vpp ep cp etp``, offloads) -> the role's ``megatron`` node;
  ``impl_cfg.use_thd`` (packed THD sequences) -> ``<role>.use_remove_padding``, ``impl_cfg.recompute=[full]`` ->
  gradient checkpointing, ``impl_cfg.optimizer`` (``fsdp2`` | ``dist_opt``: both shard the optimizer state, which is
  what FSDP2 does here).

A ``veomni`` / ``engine`` node set on a role whose engine does not read it is inert, as in verl (said in the notes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ENGINE_STRATEGIES", "check_engines", "engine_roles"]

# verl's engine names -> the strategy that reads their nodes here
ENGINE_STRATEGIES = {"dp": "fsdp", "fsdp": "fsdp", "megatron": "megatron", "veomni": "veomni", "mlite": "mlite"}
_VEOMNI_FSDP = {"param_offload": "param_offload", "optimizer_offload": "optimizer_offload",
                "enable_fsdp_offload": "offload_policy", "fsdp_size": "fsdp_size",
                "enable_full_shard": "reshard_after_forward", "forward_prefetch": "forward_prefetch", "seed": "seed"}
_MLITE_SIZES = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size",
                "vpp": "virtual_pipeline_model_parallel_size", "ep": "expert_model_parallel_size",
                "cp": "context_parallel_size", "etp": "expert_tensor_parallel_size"}
_MLITE_OPTIMIZERS = ("fsdp2", "dist_opt")


def engine_roles(cfg: Any) -> list[tuple[str, Any, Any, Any]]:
    """``(key prefix, role node, its fsdp_config, its model node)`` of the roles that train or score with an engine."""
    arr = cfg.actor_rollout_ref
    return [("actor_rollout_ref.actor", arr.actor, arr.actor.fsdp_config, arr.model),
            ("actor_rollout_ref.ref", arr.ref, arr.ref.fsdp_config, arr.model),
            ("critic", cfg.critic, cfg.critic.model.fsdp_config, cfg.critic.model)]


def _role_engine(prefix: str, node: Any, errors: list[str]) -> None:
    engine = node.model_engine
    if engine is None:
        return
    if str(engine) not in ENGINE_STRATEGIES:
        errors.append(f"{prefix}.model_engine={engine}: choose dp, megatron, veomni or mlite (verl's torchtitan and "
                      "automodel engines are not available here)")
        return
    strategy = ENGINE_STRATEGIES[str(engine)]
    if strategy in ("fsdp", "megatron") and str(node.strategy) not in ("fsdp", "fsdp2", "megatron", strategy):
        errors.append(f"{prefix}.model_engine={engine} and {prefix}.strategy={node.strategy} name different engines; "
                      "keep one of them")
        return
    if strategy == "fsdp" and node.strategy == "megatron":
        errors.append(f"{prefix}.model_engine={engine} and {prefix}.strategy=megatron name different engines; keep "
                      "one of them")
        return
    if strategy != "fsdp" or node.strategy not in ("fsdp", "fsdp2"):
        node.strategy = strategy


def _set_ulysses(prefix: str, node: Any, size: int, source: str, errors: list[str], notes: list[str]) -> None:
    current = int(node.ulysses_sequence_parallel_size or 1)
    if size <= 1:
        return
    if current not in (1, size):
        errors.append(f"{source}={size} and {prefix}.ulysses_sequence_parallel_size={current} both split the sequence; "
                      "set only one of them")
        return
    node.ulysses_sequence_parallel_size = size
    notes.append(f"{source}={size} runs as Ulysses sequence parallelism ({prefix}.ulysses_sequence_parallel_size)")


def _experts_on_nd_engine(prefix: str, node: Any, ep: int, source: str, notes: list[str]) -> str:
    if ep <= 1:
        return "fsdp2"
    node.megatron.expert_model_parallel_size = ep
    notes.append(f"{source}={ep}: {prefix} trains on the N-D engine (strategy=megatron) with its experts split over "
                 f"{ep} ranks ({prefix}.megatron.expert_model_parallel_size)")
    return "megatron"


def _veomni(prefix: str, node: Any, fsdp: Any, errors: list[str], notes: list[str]) -> None:
    v = node.veomni
    for key, target in _VEOMNI_FSDP.items():
        value = v.get(key)
        if value is None:
            continue
        if target.endswith("offload") or target == "offload_policy":  # on when either spelling asks for it
            value = bool(value) or bool(getattr(fsdp, target))
        setattr(fsdp, target, value)
    if v.get("mixed_precision") is False:
        fsdp.dtype = "float32"
    _set_ulysses(prefix, node, int(v.get("ulysses_parallel_size") or 1), f"{prefix}.veomni.ulysses_parallel_size",
                 errors, notes)
    node.strategy = _experts_on_nd_engine(prefix, node, int(v.get("expert_parallel_size") or 1),
                                          f"{prefix}.veomni.expert_parallel_size", notes)
    notes.append(f"{prefix}.strategy=veomni: trained with FSDP2 laid out by {prefix}.veomni (offload, fsdp_size, "
                 "full shard, Ulysses and expert sizes act; its kernel choices are inert)")


def _turbo(prefix: str, node: Any, fsdp: Any, model: Any, errors: list[str], notes: list[str]) -> None:
    dist = dict((fsdp.turbo_config or {}).get("distributed") or {})
    memory = dict((fsdp.turbo_config or {}).get("memory") or {})
    if int(dist.get("tensor_parallel_size") or 1) > 1:
        errors.append(f"{prefix}.fsdp_config.turbo_config.distributed.tensor_parallel_size="
                      f"{dist['tensor_parallel_size']}: reserved in FSDP-Turbo (keep 1); for tensor parallelism use "
                      f"{prefix}.strategy=megatron with {prefix}.megatron.tensor_model_parallel_size")
    if dist.get("fully_shard_parallel_size") is not None:
        fsdp.fsdp_size = int(dist["fully_shard_parallel_size"])
    key = f"{prefix}.fsdp_config.turbo_config.distributed"
    _set_ulysses(prefix, node, int(dist.get("ulysses_parallel_size") or 1), f"{key}.ulysses_parallel_size", errors,
                 notes)
    node.strategy = _experts_on_nd_engine(prefix, node, int(dist.get("expert_parallel_size") or 1),
                                          f"{key}.expert_parallel_size", notes)
    if memory.get("recompute"):
        model.enable_gradient_checkpointing = True
    notes.append(f"{prefix}.strategy=fsdp_turbo: trained with FSDP2 (fully_shard_parallel_size -> fsdp_size, "
                 "ulysses / expert sizes and memory.recompute act; its module-glob plans are inert: every decoder "
                 "layer is wrapped and recomputed)")


def _mlite(prefix: str, node: Any, model: Any, errors: list[str], notes: list[str]) -> None:
    e = node.engine
    for key, target in _MLITE_SIZES.items():
        value = e.get(key)
        if key == "vpp" and value is not None and int(value) <= 1:
            value = None
        if value is not None or key == "vpp":
            setattr(node.megatron, target, value if value is None else int(value))
    for key in ("param_offload", "optimizer_offload", "grad_offload"):
        if e.get(key):
            setattr(node.megatron, key, True)
    impl = dict(e.get("impl_cfg") or {})
    if impl.get("use_thd"):
        node.use_remove_padding = True
    recompute = impl.get("recompute") or []
    recompute = [recompute] if isinstance(recompute, str) else list(recompute)
    if any(r != "full" for r in recompute):
        errors.append(f"{prefix}.engine.impl_cfg.recompute={recompute}: only full recompute (every decoder layer, "
                      "gradient checkpointing) is built; use [full]")
    elif recompute:
        model.enable_gradient_checkpointing = True
    optimizer = impl.get("optimizer")
    if optimizer is not None and optimizer not in _MLITE_OPTIMIZERS:
        errors.append(f"{prefix}.engine.impl_cfg.optimizer={optimizer}: choose fsdp2 or dist_opt (both shard the "
                      "optimizer state over the data-parallel ranks, which FSDP2 does here)")
    node.strategy = "megatron"
    notes.append(f"{prefix}: Megatron Lite's engine node lays out {prefix}.megatron (tp, pp, vpp, ep, cp, etp, "
                 "offload); impl_cfg.use_thd packs sequences, recompute=[full] checkpoints every layer")


def _stray_nodes(cfg: Any, prefix: str, node: Any, notes: list[str]) -> None:
    from hybridflow.config.key_policy import changed_keys

    for name, reader in (("veomni", "veomni"), ("engine", "mlite")):
        changed = [k.removeprefix(f"{prefix}.{name}.") for k, _ in changed_keys(cfg, f"{prefix}.{name}")]
        if changed:
            notes.append(f"{prefix}.{name} ({', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}) has no "
                         f"effect: {prefix}.strategy={node.strategy} does not read it (verl ignores it too); set "
                         f"{prefix}.model_engine={reader} to use it")


def check_engines(cfg: Any, errors: list[str], notes: list[str]) -> None:
    """Stage-1 check, before ``megatron`` (which lays out what this writes) and ``strategies``."""
    if str(cfg.model_engine) == "veomni":
        for _, node, _, _ in engine_roles(cfg):
            node.strategy = "veomni"
        cfg.model_engine = "dp"  # the roles carry it now; the megatron check reads model_engine as dp / megatron
    for prefix, node, fsdp, model in engine_roles(cfg):
        _role_engine(prefix, node, errors)
        strategy = str(node.strategy)
        if strategy == "veomni":
            _veomni(prefix, node, fsdp, errors, notes)
        elif strategy == "fsdp_turbo":
            _turbo(prefix, node, fsdp, model, errors, notes)
        elif strategy == "mlite":
            _mlite(prefix, node, model, errors, notes)
        else:
            _stray_nodes(cfg, prefix, node, notes)
