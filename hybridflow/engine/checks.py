"""This floor's configuration rules, run by the launch's check pipeline: verl's Megatron LoRA node read into this
engine's LoRA keys (config stage); the model folders hold models the engine can load, the optimizer the config names
exists, and the data rows fit the model's tokenizer (run stage: reads ``config.json``, the tokenizer and the data
files, and imports the optimizer module; no weights load)."""

from __future__ import annotations

from hybridflow.engine.dist_checkpoint import is_dist_checkpoint
from hybridflow.engine.lora_options import hf_module_names, lora_node_problems
from hybridflow.engine.model_loader import ModelLoadError, check_causal_lm, load_hf_config
from hybridflow.engine.optim import optimizer_class

__all__ = ["check_megatron_lora", "check_model_files", "check_optimizers", "check_prompt_rows"]


def check_model_files(cfg, errors: list[str]) -> None:
    """The actor's checkpoint is a causal LM (or a supported vision-language model); the critic's and the reward
    model's folders hold a model config. Reads ``config.json`` only (what the rollout engine can serve is the
    engine's own check)."""
    model = cfg.actor_rollout_ref.model
    try:
        check_causal_lm(model.path, model.trust_remote_code)
    except ModelLoadError as e:
        errors.append(str(e))
        return
    others = []
    if cfg.use_critic:
        others.append(("critic.model.path", cfg.critic.model.path, cfg.critic.model.trust_remote_code))
    if cfg.reward_model.enable:
        rm = cfg.reward_model.model
        others.append(("reward_model.model.path", rm.path, rm.trust_remote_code))
    for key, path, remote in others:
        try:
            load_hf_config(path, remote, None, key)
        except ModelLoadError as e:
            errors.append(str(e))
    _check_dist_checkpoints(cfg, errors)


def _check_dist_checkpoints(cfg, errors: list[str]) -> None:
    """A megatron role starting from a distributed checkpoint names a DCP folder (``.metadata`` inside)."""
    roles = [("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("actor_rollout_ref.ref", cfg.actor_rollout_ref.ref)]
    if cfg.use_critic:
        roles.append(("critic", cfg.critic))
    for key, node in roles:
        m = node.megatron
        if node.strategy == "megatron" and m.use_dist_checkpointing and not is_dist_checkpoint(m.dist_checkpointing_path or ""):
            errors.append(f"{key}.megatron.dist_checkpointing_path={m.dist_checkpointing_path!r} is not a torch distributed "
                          f"checkpoint folder (no .metadata inside) and {key}.megatron.use_dist_checkpointing=true starts "
                          "the role from it: point it at a Megatron torch_dist / DCP folder, or set "
                          "use_dist_checkpointing=false to start from actor_rollout_ref.model.path")


def check_optimizers(cfg, errors: list[str]) -> None:
    """``optim.optimizer_impl`` imports and ``optim.optimizer`` names an optimizer class in it (actor; critic when
    there is one) -- the engine's own rule (``engine/optim.py``), asked before any worker builds one."""
    roles = [("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim)]
    if cfg.use_critic:
        roles.append(("critic.optim", cfg.critic.optim))
    for field, optim in roles:
        try:
            cls = optimizer_class(optim, field)
        except ValueError as e:
            errors.append(str(e))
            continue
        _check_override_names(field, cls, optim.override_optimizer_config or {}, errors)


def _check_override_names(field: str, cls, overrides: dict, errors: list[str]) -> None:
    """``override_optimizer_config`` entries are keyword arguments of the optimizer class: each must be one."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        takes = ", ".join(n for n in params if n not in ("self", "params"))
        errors.append(f"{field}.override_optimizer_config: {', '.join(unknown)} is not an argument of "
                      f"{cls.__module__}.{cls.__name__} (it takes {takes}); drop it or choose the optimizer that "
                      "takes it")


def check_prompt_rows(cfg, errors: list[str]) -> None:
    """The dataset's own row checks, with the run's tokenizer, now: rows within ``data.max_row_bytes`` and nested
    sanely, and with ``data.truncation=error`` and no ``data.filter_overlong_prompts`` every prompt within
    ``data.max_prompt_length`` (issue 34: an over-long prompt was found only when a step drew it, after 8 steps).
    Local files of a text model and the built-in dataset class (a vision model's rows are processed with their
    images when the dataset is built)."""
    from hybridflow.data.io import DataFileError, as_file_list, count_rows
    from hybridflow.data.rl_dataset import RLHFDataset
    from hybridflow.engine.model_loader import is_vision_language_config, load_tokenizer

    data, model = cfg.data, cfg.actor_rollout_ref.model
    if data.custom_cls.path:
        return  # a user's dataset class checks its own rows
    try:
        if is_vision_language_config(load_hf_config(model.path, model.trust_remote_code, None, "model.path")):
            return
        tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code,
                                   model.custom_chat_template, field="actor_rollout_ref.model.path")
        jobs = [(key, as_file_list(files, key), limit) for key, files, limit in (
            ("data.train_files", data.train_files, data.train_max_samples),
            ("data.val_files", data.val_files, data.val_max_samples)) if files is not None]
    except Exception:  # noqa: BLE001 - model_files / data_files report a broken model or file list
        return
    for key, paths, limit in jobs:
        if any(e.startswith(key) for e in errors):
            continue  # data_files already refused these files
        try:
            if any(count_rows(p) is None for p in paths):
                continue  # a hub dataset: read when it downloads
            RLHFDataset(paths, tokenizer, data, max_samples=limit)
        except (DataFileError, ValueError) as e:
            errors.append(f"{key}: {e}")


def check_megatron_lora(cfg, errors: list[str], notes: list[str]) -> None:
    """Config stage: verl's Megatron ``lora`` node (``<model>.lora.*``) read into the keys this engine's LoRA reads
    (``engine/lora_options.py``): rank, alpha, Megatron module names -> transformers' names, adapter path; the node's
    dropout / DoRA / initialisation travel to ``apply_lora`` with the node itself.  Runs before the Megatron check
    (which reads ``lora_rank``)."""
    for key, model in (("actor_rollout_ref.model", cfg.actor_rollout_ref.model), ("critic.model", cfg.critic.model)):
        node = dict(model.lora or {})
        rank = int(node.get("rank") or 0)
        if rank <= 0:
            continue
        where = f"{key}.lora"
        found = lora_node_problems(node, where)
        if int(model.lora_rank) not in (0, rank):
            found.append(f"{where}.rank={rank} and {key}.lora_rank={model.lora_rank} set the same adapters' rank; "
                         "keep one of them")
        targets, problems = hf_module_names(node.get("target_modules"), f"{where}.target_modules")
        excluded, more = hf_module_names(node.get("exclude_modules"), f"{where}.exclude_modules")
        found += problems + more
        if key == "critic.model" and (node.get("adapter_path") or node.get("exclude_modules")):
            found.append(f"{where}.adapter_path / exclude_modules: the critic's LoRA starts from scratch on "
                         f"{where}.target_modules (adapter loading and exclusions are the actor's); drop them")
        errors.extend(found)
        if found:
            continue
        model.lora_rank, model.lora_alpha = rank, float(node.get("alpha") or model.lora_alpha)
        model.target_modules = targets if targets is not None else "all-linear"
        model.exclude_modules = excluded
        if node.get("adapter_path"):
            model.lora_adapter_path = node["adapter_path"]
        notes.append(f"{where}: Megatron's LoRA node trains peft adapters (rank {rank}, alpha {model.lora_alpha:g}) on "
                     f"{model.target_modules}; the fused linear_qkv is one adapter per q / k / v projection here")
