"""Semantic checks on a typed config, with messages written for the person who made the mistake.

The batch-size rules follow verl's, but the messages explain the vocabulary with the user's own
numbers, because that vocabulary is verl's most common source of confusion:
* ``data.train_batch_size`` and ``*.ppo_mini_batch_size`` count PROMPTS (global);
* each prompt yields ``rollout.n`` trajectories, so a step trains on train_batch_size x n sequences;
* ``*_per_gpu`` sizes are per device (per worker process on CPU) and count trajectories.
Warnings (accepted-but-unused keys, deprecated spellings) are collected and returned, not raised.
"""

from __future__ import annotations

import warnings

from hybridflow.config.errors import ConfigError
from hybridflow.config.schema import PPOConfig
from hybridflow.config.validate_async import check_async_config

SUPPORTED_STRATEGIES = ("fsdp", "fsdp2")
SUPPORTED_ROLLOUTS = ("hf", "vllm", "sglang", "trtllm")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
CHOICES = {
    "data.truncation": ("error", "left", "right", "middle"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.backend": ("ray", "local"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "algorithm.pf_ppo.reweight_method": ("pow", "max_min", "max_random"),
    "actor_rollout_ref.actor.optim.lr_scheduler_type": ("constant", "cosine"),
    "critic.optim.lr_scheduler_type": ("constant", "cosine"),
    "reward_model.reward_manager": ("naive", "batch", "dapo", "prime"),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": ("strict", "ignore_strippable", "disable"),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": ("left", "right", "middle"),
}


class ConfigWarning(UserWarning):
    """A key hybridflow accepts for verl compatibility but does not act on, or a deprecated spelling."""


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def validate_config(cfg: PPOConfig) -> list[str]:
    """Raise ``ConfigError`` listing every problem; return the list of warnings (also emitted)."""
    errors: list[str] = []
    notes: list[str] = []
    _check_choices(cfg, errors)
    _check_strategies(cfg, errors)
    _check_algorithms(cfg, errors)
    _normalise_deprecated(cfg, notes)
    check_async_config(cfg, errors, notes)
    _check_batch_sizes(cfg, errors, notes)
    _check_rollout_precision(cfg, errors)
    _check_unused(cfg, notes)
    if errors:
        raise ConfigError(errors)
    for n in notes:
        warnings.warn(n, ConfigWarning, stacklevel=2)
    return notes


def _check_choices(cfg: PPOConfig, errors: list[str]) -> None:
    if not isinstance(cfg.trainer.logger, (str, list)):
        errors.append(f"trainer.logger={cfg.trainer.logger!r}: give a list of backends like [console,file] "
                      "(or one name)")
    for key, allowed in CHOICES.items():
        val = _get(cfg, key)
        if val not in allowed:
            errors.append(f"{key}={val!r} is not supported; choose one of: {', '.join(allowed)}")
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name not in SUPPORTED_ROLLOUTS:
        errors.append(f"actor_rollout_ref.rollout.name={rollout.name!r} is not supported; "
                      f"choose one of: {', '.join(SUPPORTED_ROLLOUTS)} (hf runs everywhere, including CPU)")
    if rollout.mode not in ("async", "sync"):
        errors.append(f"actor_rollout_ref.rollout.mode={rollout.mode!r}: use async")
    actor = cfg.actor_rollout_ref.actor
    for key, val in (("actor_rollout_ref.actor.loss_agg_mode", actor.loss_agg_mode),
                     ("critic.loss_agg_mode", cfg.critic.loss_agg_mode)):
        if val not in LOSS_AGG_MODES:
            errors.append(f"{key}={val!r} is not a loss aggregation mode; choose one of: {', '.join(LOSS_AGG_MODES)}")
    for key, val in (("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type),
                     ("algorithm.kl_penalty", cfg.algorithm.kl_penalty)):
        if val.rstrip("+") not in KL_ESTIMATORS:
            errors.append(f"{key}={val!r} is not a KL estimator; choose one of: {', '.join(KL_ESTIMATORS)} "
                          "(append '+' for the straight-through variant, e.g. low_var_kl+)")
    _check_agent_keys(rollout, errors)
    fg = cfg.algorithm.filter_groups
    if fg.enable and fg.metric is None:
        errors.append("algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric "
                      "(acc, score, seq_reward or seq_final_reward)")


def _check_agent_keys(rollout, errors: list[str]) -> None:
    """Agent-loop keys that cannot act here are refused (the files they name are checked before the models
    load, by ``hybridflow.agents.setup_check``)."""
    key = "actor_rollout_ref.rollout"
    if rollout.agent.num_workers < 1:
        errors.append(f"{key}.agent.num_workers={rollout.agent.num_workers}: at least one agent-loop worker is needed")
    mt = rollout.multi_turn
    if mt.use_inference_chat_template:
        errors.append(f"{key}.multi_turn.use_inference_chat_template=true belongs to verl's retired SGLang multi-turn "
                      "rollout; agent loops append the template's own continuation tokens. Remove the key.")
    if mt.num_repeat_rollouts is not None:
        errors.append(f"{key}.multi_turn.num_repeat_rollouts={mt.num_repeat_rollouts} belongs to verl's retired SGLang "
                      f"multi-turn rollout; use {key}.n for samples per prompt.")
    for name in ("max_assistant_turns", "max_user_turns"):
        value = getattr(mt, name)
        if value is not None and value < 1:
            errors.append(f"{key}.multi_turn.{name}={value}: give a positive number of turns, or null for no limit")
    if mt.max_parallel_calls < 1 or mt.max_tool_response_length < 1:
        errors.append(f"{key}.multi_turn.max_parallel_calls and max_tool_response_length must be >= 1")
    server = rollout.agent.custom_async_server
    if server.path is not None or server.name is not None:
        errors.append(f"{key}.agent.custom_async_server is verl's hook for its own server actor classes; in hybridflow "
                      "an engine implements hybridflow.rollout.RolloutEngine and is registered in ROLLOUT_ENGINES "
                      "(selected by rollout.name). Remove the key.")


def _check_strategies(cfg: PPOConfig, errors: list[str]) -> None:
    pairs = [
        ("actor_rollout_ref.actor.strategy", cfg.actor_rollout_ref.actor.strategy),
        ("actor_rollout_ref.ref.strategy", cfg.actor_rollout_ref.ref.strategy),
        ("critic.strategy", cfg.critic.strategy),
        ("reward_model.strategy", cfg.reward_model.strategy),
    ]
    if pairs[0][1] == "megatron":  # ref and critic follow the actor's strategy: report it once
        pairs = pairs[:1]
    for key, val in pairs:
        if val == "megatron":
            errors.append(f"{key}=megatron is not supported: hybridflow trains with FSDP2. "
                          f"Use {key}=fsdp2 (or fsdp, which means the same here).")
        elif val not in SUPPORTED_STRATEGIES:
            errors.append(f"{key}={val!r} is not supported; choose one of: {', '.join(SUPPORTED_STRATEGIES)}")


def _check_algorithms(cfg: PPOConfig, errors: list[str]) -> None:
    """Names must exist in the algorithm registries (so custom registered ones are accepted)."""
    try:
        from hybridflow.algorithms import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    except ImportError:  # algorithms not importable: nothing to check against
        return
    est = cfg.algorithm.adv_estimator
    if est not in ADV_ESTIMATOR_REGISTRY:
        errors.append(f"algorithm.adv_estimator={est!r}: {ADV_ESTIMATOR_REGISTRY.unknown_message(est)}")
    if est == "optimal_token_baseline" and not cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
        errors.append("algorithm.adv_estimator=optimal_token_baseline weights each token by the energy "
                      "1 - 2*pi + sum(pi^2), which needs the actor's sum_pi_squared: set "
                      "actor_rollout_ref.actor.calculate_sum_pi_squared=true")
    rc = cfg.algorithm.rollout_correction
    if (rc.rollout_is is not None or rc.rollout_rs is not None) and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        errors.append("algorithm.rollout_correction.rollout_is/rollout_rs compare the actor's log-probs with the "
                      "rollout's own: set actor_rollout_ref.rollout.calculate_log_probs=true")
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode not in POLICY_LOSS_REGISTRY:
        errors.append(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode!r}: "
                      f"{POLICY_LOSS_REGISTRY.unknown_message(mode)}")


def _normalise_deprecated(cfg: PPOConfig, notes: list[str]) -> None:
    # verl's tracker takes one bare backend name as well as a list (trainer.logger=console).
    if isinstance(cfg.trainer.logger, str):
        cfg.trainer.logger = [cfg.trainer.logger]
    # verl has two spellings of gradient clipping; the engine reads <role>.grad_clip.
    for key, role in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor), ("critic", cfg.critic)):
        if role.optim.clip_grad != 1.0 and role.grad_clip == 1.0:
            role.grad_clip = role.optim.clip_grad
            notes.append(f"{key}.optim.clip_grad={role.optim.clip_grad} is used as {key}.grad_clip")
    actor = cfg.actor_rollout_ref.actor
    if actor.use_gpg_loss and actor.policy_loss.loss_mode in ("vanilla", "gpg"):
        actor.policy_loss.loss_mode = "gpg"
        notes.append("actor_rollout_ref.actor.use_gpg_loss is deprecated; using "
                     "actor_rollout_ref.actor.policy_loss.loss_mode=gpg")
    elif actor.use_gpg_loss:
        notes.append(f"actor_rollout_ref.actor.use_gpg_loss=true is ignored: policy_loss.loss_mode="
                     f"{actor.policy_loss.loss_mode} is set explicitly")
    for key, optim in (("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim),
                       ("critic.optim", cfg.critic.optim)):
        if optim.warmup_style is not None:
            notes.append(f"{key}.warmup_style is deprecated; using it as {key}.lr_scheduler_type={optim.warmup_style}")
            optim.lr_scheduler_type = optim.warmup_style


def n_devices(cfg: PPOConfig) -> int:
    """Devices of the training pool; the local backend always runs one process."""
    if cfg.trainer.backend == "local":
        return 1
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def _check_batch_sizes(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    data, arr = cfg.data, cfg.actor_rollout_ref
    actor, rollout = arr.actor, arr.rollout
    n, n_dev = rollout.n, n_devices(cfg)
    if n < 1:
        errors.append(f"actor_rollout_ref.rollout.n={n}: must be >= 1 (responses sampled per prompt)")
        return
    if n_dev < 1:
        errors.append(f"trainer.nnodes x trainer.n_gpus_per_node = {n_dev}: at least one device is needed")
        return
    if data.train_batch_size < 1 or actor.ppo_mini_batch_size < 1:
        errors.append("data.train_batch_size and actor_rollout_ref.actor.ppo_mini_batch_size must be >= 1")
        return
    vocab = (f"(data.train_batch_size={data.train_batch_size} prompts x rollout.n={n} = "
             f"{data.train_batch_size * n} trajectories per step, over {n_dev} device(s))")
    if (data.train_batch_size * n) % n_dev:
        errors.append(f"the {data.train_batch_size * n} trajectories of a step cannot be split evenly over "
                      f"{n_dev} devices {vocab}; make train_batch_size x rollout.n a multiple of "
                      f"trainer.nnodes x trainer.n_gpus_per_node")
    if actor.ppo_mini_batch_size > data.train_batch_size:
        errors.append(f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} is larger than "
                      f"data.train_batch_size={data.train_batch_size}; both count prompts, and a step is cut into "
                      f"mini-batches of ppo_mini_batch_size prompts, so it must be <= train_batch_size")
    _check_micro(cfg, "actor_rollout_ref.actor", actor.ppo_mini_batch_size, actor.ppo_micro_batch_size,
                 actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz, "ppo_micro_batch_size", errors, notes)
    if cfg.use_critic:
        c = cfg.critic
        _check_micro(cfg, "critic", c.ppo_mini_batch_size, c.ppo_micro_batch_size, c.ppo_micro_batch_size_per_gpu,
                     c.use_dynamic_bsz, "ppo_micro_batch_size", errors, notes)
    for role, node in (("actor_rollout_ref.rollout", rollout), ("actor_rollout_ref.ref", arr.ref)):
        if node.log_prob_micro_batch_size is not None and node.log_prob_micro_batch_size_per_gpu is not None:
            errors.append(f"set only one of {role}.log_prob_micro_batch_size (deprecated, global) and "
                          f"{role}.log_prob_micro_batch_size_per_gpu")
        elif node.log_prob_micro_batch_size is not None:
            node.log_prob_micro_batch_size_per_gpu = max(1, node.log_prob_micro_batch_size // n_dev)
            notes.append(f"{role}.log_prob_micro_batch_size is deprecated (global); using "
                         f"{role}.log_prob_micro_batch_size_per_gpu={node.log_prob_micro_batch_size_per_gpu}")
        if node.log_prob_micro_batch_size_per_gpu is None and not node.log_prob_use_dynamic_bsz:
            node.log_prob_micro_batch_size_per_gpu = actor.ppo_micro_batch_size_per_gpu or 8
    if cfg.algorithm.adv_estimator in ("grpo", "rloo", "grpo_passk", "reinforce_plus_plus_baseline") and n == 1:
        notes.append(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} compares the responses of one prompt, "
                     "but actor_rollout_ref.rollout.n=1: every advantage will be 0. Set rollout.n >= 2.")


_PRECISIONS = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
               "fp16": "fp16", "float16": "fp16", "half": "fp16"}


def _check_rollout_precision(cfg: PPOConfig, errors: list[str]) -> None:
    """Where the rollout's log-probs stand in for pi_old, the rollout must compute in the training precision.

    That is the trainer's ``StepPlan.reuse_rollout_log_probs`` (``rollout.calculate_log_probs=true`` with an
    exactly on-policy update -- one mini-batch, one epoch, no IS/RS correction -- or ``bypass_mode``).  On
    GPU the hf rollout computes in ``rollout.dtype`` and the actor in ``actor.fsdp_config.dtype``; on CPU
    both compute in fp32, so there is nothing to compare.
    """
    arr = cfg.actor_rollout_ref
    rollout, actor = arr.rollout, arr.actor
    for key, val in (("actor_rollout_ref.rollout.dtype", rollout.dtype),
                     ("actor_rollout_ref.actor.fsdp_config.dtype", actor.fsdp_config.dtype)):
        if str(val).lower() not in _PRECISIONS:
            errors.append(f"{key}={val!r} is not a known dtype; use one of bfloat16, float16, float32")
            return
    rc = cfg.algorithm.rollout_correction
    one_update = actor.ppo_mini_batch_size >= cfg.data.train_batch_size and actor.ppo_epochs == 1
    corrects = rc.rollout_is is not None or rc.rollout_rs is not None
    if not (rollout.calculate_log_probs and ((one_update and not corrects) or rc.bypass_mode)):
        return
    rollout_p, actor_p = _PRECISIONS[str(rollout.dtype).lower()], _PRECISIONS[str(actor.fsdp_config.dtype).lower()]
    if rollout_p == actor_p or cfg.trainer.device == "cpu":
        return
    if cfg.trainer.device == "auto":
        import torch  # the config layer needs torch only for this question

        if not torch.cuda.is_available():
            return
    errors.append(
        f"actor_rollout_ref.rollout.dtype={rollout.dtype} but actor_rollout_ref.actor.fsdp_config.dtype="
        f"{actor.fsdp_config.dtype}: with rollout.calculate_log_probs=true and an exactly on-policy update the "
        "rollout's log-probs are used as pi_old, so they must come from the training precision. Set "
        f"actor_rollout_ref.rollout.dtype={actor.fsdp_config.dtype}, or let the actor recompute pi_old "
        "(rollout.calculate_log_probs=false)"
    )


def _check_micro(cfg, role, mini, micro_global, micro_per_gpu, dynamic, name, errors, notes) -> None:
    n, n_dev = cfg.actor_rollout_ref.rollout.n, n_devices(cfg)
    node = _get(cfg, role)
    if micro_global is not None and micro_per_gpu is not None:
        errors.append(f"set only one of {role}.{name} (deprecated, global) and {role}.{name}_per_gpu")
        return
    if micro_global is not None:
        micro_per_gpu = max(1, micro_global // n_dev)
        setattr(node, f"{name}_per_gpu", micro_per_gpu)
        notes.append(f"{role}.{name} is deprecated (global); using {role}.{name}_per_gpu={micro_per_gpu}")
    trajectories = mini * n
    if trajectories % n_dev:
        errors.append(f"{role}.ppo_mini_batch_size={mini} prompts x rollout.n={n} = {trajectories} trajectories "
                      f"per mini-batch cannot be split over {n_dev} devices; make it a multiple of {n_dev}")
        return
    per_dev = trajectories // n_dev
    if dynamic:
        return
    if micro_per_gpu is None:
        errors.append(f"{role}.{name}_per_gpu is not set: each device's share of a mini-batch "
                      f"({mini} prompts x {n} = {trajectories} trajectories / {n_dev} devices = {per_dev}) is "
                      f"processed in micro-batches of this many trajectories. Set it (e.g. "
                      f"{role}.{name}_per_gpu={_largest_divisor(per_dev, 8)}) or use {role}.use_dynamic_bsz=true")
        return
    if micro_per_gpu < 1 or per_dev % micro_per_gpu:
        errors.append(f"{role}.{name}_per_gpu={micro_per_gpu} must divide the per-device mini-batch: "
                      f"{mini} prompts x rollout.n={n} / {n_dev} devices = {per_dev} trajectories per device")


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


_UNUSED = {
    "actor_rollout_ref.model.use_liger": False,
    "actor_rollout_ref.model.use_fused_kernels": False,
    "actor_rollout_ref.model.enable_activation_offload": False,
    "actor_rollout_ref.model.use_shm": False,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 1,
    "critic.ulysses_sequence_parallel_size": 1,
    "data.use_shm": False,
    "trainer.default_hdfs_dir": None,
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap": None,
    "actor_rollout_ref.ref.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap": None,
    "critic.model.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap": None,
    "reward_model.rollout.name": None,
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing": False,
    "actor_rollout_ref.ref.fsdp_config.entropy_checkpointing": False,
    "actor_rollout_ref.rollout.max_batch_size": None,
}


def _check_unused(cfg: PPOConfig, notes: list[str]) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name in ("vllm", "sglang", "trtllm"):
        notes.append(f"actor_rollout_ref.rollout.name={rollout.name}: this version has no {rollout.name} adapter yet; "
                     "the run will stop when the workers start. Use rollout.name=hf (runs on CPU and GPU).")
    for key, default in _UNUSED.items():
        val = _get(cfg, key)
        if val != default:
            notes.append(f"{key}={val!r} is accepted for verl compatibility but has no effect in hybridflow")
    if cfg.global_profiler or cfg.actor_rollout_ref.actor.profiler:
        notes.append("profiler settings are accepted for verl compatibility but ignored (use torch.profiler "
                     "or py-spy around `hybridflow train`)")
