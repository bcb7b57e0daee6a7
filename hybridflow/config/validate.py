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
from hybridflow.config.key_policy import inert_note, refusal_errors
from hybridflow.config.schema import PPOConfig
from hybridflow.config.validate_async import check_async_config
from hybridflow.config.validate_parallel import check_sequence_parallel, data_parallel_size
from hybridflow.config.validate_judge import check_judge
from hybridflow.config.validate_recipes import check_recipes

# verl's loss aggregation modes (algorithms/aggregation.py implements each; config cannot import algorithms)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

# dtype spellings the engine understands (engine/device.py maps them; tests/config keeps the two in step)
DTYPE_NAMES = ("fp32", "float32", "float", "bf16", "bfloat16", "fp16", "float16", "half")
SUPPORTED_STRATEGIES = ("fsdp", "fsdp2")
SUPPORTED_ROLLOUTS = ("hf", "vllm", "sglang", "trtllm")
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
    check_recipes(cfg, errors, notes)
    check_judge(cfg, errors, notes)
    _normalise_deprecated(cfg, notes)
    check_async_config(cfg, errors, notes)
    _check_batch_sizes(cfg, errors, notes)
    check_sequence_parallel(cfg, errors)
    _check_legacy_micro(cfg, errors, notes)
    _check_sampling(cfg, errors)
    _check_dtypes(cfg, errors)
    _check_async_reward(cfg, errors)
    _check_schedules(cfg, errors)
    _check_rollout_precision(cfg, errors, notes)
    errors.extend(refusal_errors(cfg))
    _check_unused(cfg, notes)
    _check_rollout_hardware(cfg, errors, notes)
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
    if rollout.mode != "async":
        errors.append(f"actor_rollout_ref.rollout.mode={rollout.mode!r}: the rollout is always served to agent loops "
                      "(verl removed mode=sync as well); use actor_rollout_ref.rollout.mode=async")
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
    tolerated = cfg.trainer.tolerated_failure_fraction
    if not 0.0 <= tolerated <= 1.0:
        errors.append(f"trainer.tolerated_failure_fraction={tolerated!r} must be between 0 (stop at the first failed "
                      "trajectory, reward or tool call of a step) and 1 (stop only when all of a step's failed)")
    fg = cfg.algorithm.filter_groups
    if fg.enable and fg.metric is None:
        errors.append("algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric "
                      "(acc, score, seq_reward or seq_final_reward)")


def _check_agent_keys(rollout, errors: list[str]) -> None:
    """Agent-loop keys that cannot act here are refused (the files they name are checked before the models
    load, by ``hybridflow.agents.setup_check``)."""
    key = "actor_rollout_ref.rollout"
    if rollout.agent.num_workers is not None and rollout.agent.num_workers < 1:
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
    _check_rollout_correction(cfg, errors)
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode not in POLICY_LOSS_REGISTRY:
        errors.append(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode!r}: "
                      f"{POLICY_LOSS_REGISTRY.unknown_message(mode)}")


ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_RS_LEVELS = ("token", "sequence", "geometric")
BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")
# reward managers the agent loops' reward loop can run per trajectory (hybridflow.agents.reward_loop)
PER_SAMPLE_REWARD_MANAGERS = ("naive", "dapo", "prime")


def _check_rollout_correction(cfg: PPOConfig, errors: list[str]) -> None:
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    calc = cfg.actor_rollout_ref.rollout.calculate_log_probs
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS_LEVELS:
        errors.append(f"{key}.rollout_is={rc.rollout_is!r}: choose null, {' or '.join(ROLLOUT_IS_LEVELS)}")
    if rc.rollout_rs is not None and rc.rollout_rs not in ROLLOUT_RS_LEVELS:
        errors.append(f"{key}.rollout_rs={rc.rollout_rs!r}: choose null, {', '.join(ROLLOUT_RS_LEVELS)}")
    if rc.rollout_rs is not None and (rc.rollout_rs_threshold is None or rc.rollout_rs_threshold <= 0):
        errors.append(f"{key}.rollout_rs={rc.rollout_rs} rejects tokens whose ratio leaves [1/t, t]: set "
                      f"{key}.rollout_rs_threshold to t > 0 (e.g. 2.0)")
    if (rc.rollout_is is not None or rc.rollout_rs is not None) and not calc:
        errors.append(f"{key}.rollout_is/rollout_rs compare the actor's log-probs with the rollout's own: set "
                      "actor_rollout_ref.rollout.calculate_log_probs=true")
    if rc.loss_type not in BYPASS_LOSS_TYPES:
        errors.append(f"{key}.loss_type={rc.loss_type!r}: choose one of {', '.join(BYPASS_LOSS_TYPES)}")
    elif rc.loss_type != "ppo_clip" and not rc.bypass_mode:
        errors.append(f"{key}.loss_type={rc.loss_type} selects the bypass-mode loss and acts only with "
                      f"{key}.bypass_mode=true; in decoupled mode the loss is actor_rollout_ref.actor.policy_loss."
                      "loss_mode (set bypass_mode=true, or drop loss_type)")
    if not rc.bypass_mode:
        return
    if not calc:
        errors.append(f"{key}.bypass_mode=true uses the rollout's log-probs as pi_old: set "
                      "actor_rollout_ref.rollout.calculate_log_probs=true")
    mode = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if mode != "vanilla":
        errors.append(f"{key}.bypass_mode=true replaces the policy loss (loss_type=ppo_clip: PPO clip against the "
                      f"rollout's log-probs; reinforce: IS-weighted REINFORCE), so actor_rollout_ref.actor.policy_loss."
                      f"loss_mode={mode} would be ignored: leave loss_mode=vanilla or set bypass_mode=false")
    if cfg.algorithm.adv_estimator == "optimal_token_baseline":
        errors.append(f"{key}.bypass_mode=true skips the actor's log-prob pass, which is where "
                      "algorithm.adv_estimator=optimal_token_baseline gets sum_pi_squared: use one or the other")


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
    # verl mirrors <role>.entropy_checkpointing into its engine's fsdp_config; either spelling turns it on
    actor.entropy_checkpointing = bool(actor.entropy_checkpointing or actor.fsdp_config.entropy_checkpointing)
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
    _check_group_size(cfg, errors, notes)


def _check_group_size(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """Group estimators with ``rollout.n=1``: each prompt is a group of one (verl's singleton rule)."""
    est, n = cfg.algorithm.adv_estimator, cfg.actor_rollout_ref.rollout.n
    if n != 1:
        return
    if est == "grpo_passk":
        errors.append("algorithm.adv_estimator=grpo_passk credits the best of each prompt's responses over the "
                      "second best, which needs actor_rollout_ref.rollout.n >= 2")
    elif est in ("grpo", "rloo"):
        notes.append(f"algorithm.adv_estimator={est} with actor_rollout_ref.rollout.n=1: every prompt is a group of "
                     "one, so there is no group baseline and the advantage is the raw score (REINFORCE without a "
                     "baseline). Set rollout.n >= 2 for the group-relative advantage.")
    elif est == "reinforce_plus_plus_baseline":
        notes.append("algorithm.adv_estimator=reinforce_plus_plus_baseline with actor_rollout_ref.rollout.n=1: every "
                     "prompt is a group of one, so no group mean is subtracted and the scores are only whitened over "
                     "the batch (the same as reinforce_plus_plus). Set rollout.n >= 2 for the group baseline.")


def _check_legacy_micro(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """verl's deprecated global micro-batch sizes of the critic's forward pass and the reward model: divided by
    the device count into the ``*_per_gpu`` key each worker reads (as verl's workers do)."""
    n_dev = n_devices(cfg)
    pairs = [("reward_model", cfg.reward_model, "micro_batch_size")]
    if cfg.use_critic:
        pairs.insert(0, ("critic", cfg.critic, "forward_micro_batch_size"))
    for role, node, name in pairs:
        glob, per = getattr(node, name), getattr(node, f"{name}_per_gpu")
        if glob is None:
            continue
        if per is not None and not (role == "critic" and glob == node.ppo_micro_batch_size):
            errors.append(f"set only one of {role}.{name} (deprecated, global) and {role}.{name}_per_gpu")
            continue
        if per is None:
            setattr(node, f"{name}_per_gpu", max(1, glob // n_dev))
            notes.append(f"{role}.{name}={glob} is deprecated (global); using "
                         f"{role}.{name}_per_gpu={getattr(node, f'{name}_per_gpu')}")
    if cfg.use_critic and cfg.critic.forward_micro_batch_size_per_gpu is None and not cfg.critic.use_dynamic_bsz:
        cfg.critic.forward_micro_batch_size_per_gpu = cfg.critic.ppo_micro_batch_size_per_gpu


def _check_sampling(cfg: PPOConfig, errors: list[str]) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.temperature <= 0:
        how = ("do_sample=true asks for samples, but temperature=0 is greedy decoding: the rollout.n responses of a "
               "prompt would be identical" if rollout.do_sample else "greedy training rollouts")
        errors.append(f"actor_rollout_ref.rollout.temperature={rollout.temperature} with "
                      f"do_sample={str(rollout.do_sample).lower()}: {how}, and the actor scores the sampled tokens "
                      "under softmax(logits / temperature), which is undefined at 0. Set rollout.temperature > 0 "
                      "(1.0 samples from the model); greedy decoding belongs in rollout.val_kwargs")


def _check_async_reward(cfg: PPOConfig, errors: list[str]) -> None:
    if not cfg.reward_model.launch_reward_fn_async:
        return
    key = "reward_model.launch_reward_fn_async=true"
    if cfg.algorithm.filter_groups.enable:
        errors.append(f"{key} scores while the log-prob passes run, but algorithm.filter_groups (DAPO dynamic "
                      "sampling) needs the scores before the batch exists, to choose its groups: use one or the other")
    if cfg.reward_model.enable:
        errors.append(f"{key} runs the reward *function* in the background; with reward_model.enable=true the scores "
                      "come from the reward-model worker group instead, so there is nothing to launch: drop one")
    elif cfg.reward_model.use_reward_loop and cfg.reward_model.reward_manager in PER_SAMPLE_REWARD_MANAGERS:
        errors.append(f"{key} scores the batch in the background after generation, but reward_model.use_reward_loop"
                      f"=true (the default) with the {cfg.reward_model.reward_manager} manager already scores every "
                      "trajectory while generation runs: set reward_model.use_reward_loop=false to score in the "
                      "background instead, or drop launch_reward_fn_async")


def _check_dtypes(cfg: PPOConfig, errors: list[str]) -> None:
    nodes = (("actor_rollout_ref.actor.fsdp_config", cfg.actor_rollout_ref.actor.fsdp_config),
             ("actor_rollout_ref.ref.fsdp_config", cfg.actor_rollout_ref.ref.fsdp_config),
             ("critic.model.fsdp_config", cfg.critic.model.fsdp_config),
             ("reward_model.model.fsdp_config", cfg.reward_model.model.fsdp_config))
    for key, node in nodes:
        mp = node.mixed_precision
        for name, value in (("model_dtype", node.model_dtype), ("dtype", node.dtype),
                            ("mixed_precision.param_dtype", mp.param_dtype),
                            ("mixed_precision.reduce_dtype", mp.reduce_dtype),
                            ("mixed_precision.buffer_dtype", mp.buffer_dtype)):
            if value is not None and str(value).lower() not in DTYPE_NAMES + ("auto",):
                errors.append(f"{key}.{name}={value!r} is not a dtype; use one of {', '.join(DTYPE_NAMES)}")


def _check_schedules(cfg: PPOConfig, errors: list[str]) -> None:
    for key, optim in (("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim),
                       ("critic.optim", cfg.critic.optim)):
        kind = optim.warmup_style or optim.lr_scheduler_type
        if kind != "cosine":
            continue
        if optim.min_lr_ratio is None:
            errors.append(f"{key}.min_lr_ratio is null but {key}.lr_scheduler_type=cosine decays towards "
                          f"min_lr_ratio x lr: set {key}.min_lr_ratio to a number in [0, 1] (0.0 decays to zero)")
        elif not 0.0 <= optim.min_lr_ratio <= 1.0:
            errors.append(f"{key}.min_lr_ratio={optim.min_lr_ratio} must lie in [0, 1] (a fraction of the lr)")


_PRECISIONS = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "bf16": "bf16", "bfloat16": "bf16",
               "fp16": "fp16", "float16": "fp16", "half": "fp16"}


def _on_cuda(cfg: PPOConfig) -> bool:
    if cfg.trainer.device != "auto":
        return cfg.trainer.device == "cuda"
    import torch  # the config layer needs torch only for this question

    return torch.cuda.is_available()


def _check_rollout_precision(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """Where the rollout's log-probs stand in for pi_old, the rollout must compute in the training precision.

    That is the trainer's ``StepPlan.reuse_rollout_log_probs`` (``rollout.calculate_log_probs=true`` with an
    exactly on-policy update -- one mini-batch, one epoch, no IS/RS correction -- or ``bypass_mode``).  On
    GPU the hf rollout computes in ``rollout.dtype`` and the actor in ``actor.fsdp_config.dtype``; on CPU
    both compute in fp32, so there is nothing to compare (a non-default ``rollout.dtype`` or
    ``gpu_memory_utilization`` on CPU gets a note saying it has no effect there).
    """
    arr = cfg.actor_rollout_ref
    rollout, actor = arr.rollout, arr.actor
    for key, val in (("actor_rollout_ref.rollout.dtype", rollout.dtype),
                     ("actor_rollout_ref.actor.fsdp_config.dtype", actor.fsdp_config.dtype)):
        if str(val).lower() not in _PRECISIONS:
            errors.append(f"{key}={val!r} is not a known dtype; use one of bfloat16, float16, float32")
            return
    on_cuda = _on_cuda(cfg)
    if not on_cuda and rollout.name == "hf":
        if _PRECISIONS[str(rollout.dtype).lower()] != "bf16":
            notes.append(f"actor_rollout_ref.rollout.dtype={rollout.dtype} has no effect on CPU: the hf rollout "
                         "computes in fp32 there, like the actor")
        if rollout.gpu_memory_utilization != 0.5:
            notes.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={rollout.gpu_memory_utilization} has no "
                         "effect on CPU: the hf KV cache is bounded by rollout.max_num_seqs and max_model_len there")
    rc = cfg.algorithm.rollout_correction
    one_update = actor.ppo_mini_batch_size >= cfg.data.train_batch_size and actor.ppo_epochs == 1
    corrects = rc.rollout_is is not None or rc.rollout_rs is not None
    if not (rollout.calculate_log_probs and ((one_update and not corrects) or rc.bypass_mode)):
        return
    rollout_p, actor_p = _PRECISIONS[str(rollout.dtype).lower()], _PRECISIONS[str(actor.fsdp_config.dtype).lower()]
    if rollout_p == actor_p or not on_cuda:
        return
    errors.append(
        f"actor_rollout_ref.rollout.dtype={rollout.dtype} but actor_rollout_ref.actor.fsdp_config.dtype="
        f"{actor.fsdp_config.dtype}: with rollout.calculate_log_probs=true and an exactly on-policy update the "
        "rollout's log-probs are used as pi_old, so they must come from the training precision. Set "
        f"actor_rollout_ref.rollout.dtype={actor.fsdp_config.dtype}, or let the actor recompute pi_old "
        "(rollout.calculate_log_probs=false)"
    )


def _check_micro(cfg, role, mini, micro_global, micro_per_gpu, dynamic, name, errors, notes) -> None:
    # with sequence parallelism a mini-batch is split over the dp = devices / sp groups
    n, n_dev = cfg.actor_rollout_ref.rollout.n, data_parallel_size(cfg, role)
    devices = "devices" if n_dev == n_devices(cfg) else "data-parallel groups (devices / ulysses_sequence_parallel_size)"
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
                      f"per mini-batch cannot be split over {n_dev} {devices}; make it a multiple of {n_dev}")
        return
    per_dev = trajectories // n_dev
    if dynamic:
        return
    if micro_per_gpu is None:
        errors.append(f"{role}.{name}_per_gpu is not set: each device's share of a mini-batch "
                      f"({mini} prompts x {n} = {trajectories} trajectories / {n_dev} {devices} = {per_dev}) is "
                      f"processed in micro-batches of this many trajectories. Set it (e.g. "
                      f"{role}.{name}_per_gpu={_largest_divisor(per_dev, 8)}) or use {role}.use_dynamic_bsz=true")
        return
    if micro_per_gpu < 1 or per_dev % micro_per_gpu:
        errors.append(f"{role}.{name}_per_gpu={micro_per_gpu} must divide the per-device mini-batch: "
                      f"{mini} prompts x rollout.n={n} / {n_dev} {devices} = {per_dev} trajectories per device")


def _largest_divisor(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def _check_rollout_hardware(cfg: PPOConfig, errors: list[str], notes: list[str]) -> None:
    """Rollout keys that cannot act on this machine's device (see validate_rollout)."""
    from hybridflow.config.validate_rollout import (
        gpu_visible,
        rollout_hardware_errors,
        rollout_hardware_notes,
    )

    if cfg.trainer.device == "cpu":
        errors.extend(rollout_hardware_errors(cfg, "cpu"))
        notes.extend(rollout_hardware_notes(cfg, "cpu"))
    elif cfg.trainer.device == "auto" and not gpu_visible():
        for problem in rollout_hardware_errors(cfg, "cpu"):
            notes.append(f"no GPU on this machine, so `hybridflow train` here would stop with: {problem}")


def _check_unused(cfg: PPOConfig, notes: list[str]) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name == "trtllm":
        notes.append("actor_rollout_ref.rollout.name=trtllm: this version has no trtllm adapter; "
                     "the run will stop when the workers start. Use rollout.name=vllm or hf.")
    note = inert_note(cfg)  # every inert key the command line set, in one note
    if note:
        notes.append(note)
