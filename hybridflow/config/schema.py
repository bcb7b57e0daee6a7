"""Typed configuration: one dataclass per node of the verl key tree.

Defaults live in ``ppo_trainer.yaml`` (one source, as in verl, with the same interpolations); these
classes give every key a type so a typo or a wrong type fails at start-up with a precise message
instead of deep inside a worker. Field names are verl's, so worker code ports unchanged.
Free-form nodes (``override_config``, ``engine_kwargs``, ``reward_kwargs``...) are ``dict``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from hybridflow.config.recipes import (
    ActorRecipeKeys,
    AlgoRecipeKeys,
    DataRecipeKeys,
    DistillationConfig,
    JudgeConfig,
    PrimeRewardModelKeys,
    PrimeRewardModelModelKeys,
    TrainerRecipeKeys,
)

KW = dict(kw_only=True)


# ----------------------------------------------------------------------------- data
@dataclass(**KW)
class PathName:
    path: Optional[str]
    name: Optional[str]


@dataclass(**KW)
class SamplerConfig:
    class_path: Optional[str]
    class_name: Optional[str]


@dataclass(**KW)
class DataConfig(DataRecipeKeys):
    # verl keeps ``data`` schemaless because a custom dataset (data.custom_cls) receives this node and may
    # read keys of its own; such keys arrive as ``+data.<key>=v`` and are kept as attributes here.
    ACCEPTS_ADDED_KEYS: ClassVar[bool] = True

    tokenizer: Optional[str]
    use_shm: bool
    train_files: Any  # str or list[str]
    val_files: Any
    train_max_samples: int
    val_max_samples: int
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    gen_batch_size: int
    val_batch_size: Optional[int]
    return_raw_input_ids: bool
    return_raw_chat: bool
    return_full_prompt: bool
    shuffle: bool
    seed: Optional[int]
    dataloader_num_workers: int
    validation_shuffle: bool
    filter_overlong_prompts: bool
    filter_overlong_prompts_workers: int
    truncation: str
    image_key: str
    video_key: str
    trust_remote_code: bool
    return_multi_modal_inputs: bool
    custom_cls: PathName
    sampler: SamplerConfig
    datagen: PathName
    apply_chat_template_kwargs: dict
    tool_config_path: Optional[str]


# ----------------------------------------------------------------------------- model / engine
@dataclass(**KW)
class WrapPolicy:
    min_num_params: int
    # verl's wrap policy may name the decoder-layer classes to shard; FSDP2 here wraps each decoder layer
    # it finds, so the list is accepted for compatibility. Defaulted so code building a policy by hand
    # (the SFT trainer) need not spell it out.
    transformer_layer_cls_to_wrap: Optional[list] = None


@dataclass(**KW)
class MixedPrecisionConfig:
    """verl's ``fsdp_config.mixed_precision`` (``+...fsdp_config.mixed_precision.param_dtype=bf16``): the dtype
    FSDP computes in (the unsharded parameters), reduces gradients in, and keeps buffers in; null = not set."""

    param_dtype: Optional[str] = None
    reduce_dtype: Optional[str] = None
    buffer_dtype: Optional[str] = None


@dataclass(**KW)
class FSDPConfig:
    wrap_policy: WrapPolicy
    param_offload: bool
    grad_offload: bool
    optimizer_offload: bool
    offload_policy: bool
    reshard_after_forward: bool
    fsdp_size: int
    forward_prefetch: bool
    model_dtype: str
    dtype: str
    use_orig_params: bool
    seed: int
    full_determinism: bool
    # verl mirrors the role's entropy_checkpointing into its engine config; the role key is the one read
    # here. Defaulted so code building an FSDP config by hand (the SFT trainer) need not spell it out.
    entropy_checkpointing: bool = False
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass(**KW)
class OptimConfig:
    optimizer: str
    optimizer_impl: str
    lr: float
    lr_warmup_steps_ratio: float
    lr_warmup_steps: int
    total_training_steps: int
    weight_decay: float
    betas: list
    clip_grad: float
    min_lr_ratio: Optional[float]
    num_cycles: float
    lr_scheduler_type: str
    warmup_style: Optional[str]
    override_optimizer_config: Optional[dict]


@dataclass(**KW)
class CheckpointContents:
    save_contents: list
    load_contents: list
    async_save: bool


@dataclass(**KW)
class FusedKernelOptions:
    impl_backend: str


@dataclass(**KW)
class ModelConfig:
    path: str
    hf_config_path: Optional[str]
    tokenizer_path: Optional[str]
    use_shm: bool
    trust_remote_code: bool
    custom_chat_template: Optional[str]
    external_lib: Optional[str]
    override_config: dict
    enable_gradient_checkpointing: bool
    enable_activation_offload: bool
    use_remove_padding: bool
    use_liger: bool
    use_fused_kernels: bool
    fused_kernel_options: FusedKernelOptions
    lora_rank: int
    lora_alpha: float
    target_modules: Any  # "all-linear" or a list of module names
    exclude_modules: Any
    lora_adapter_path: Optional[str]


@dataclass(**KW)
class PolicyLossConfig:
    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float


@dataclass(**KW)
class ActorConfig(ActorRecipeKeys):
    strategy: str
    ppo_mini_batch_size: int
    ppo_micro_batch_size: Optional[int]
    ppo_micro_batch_size_per_gpu: Optional[int]
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    clip_ratio: float
    clip_ratio_low: Optional[float]
    clip_ratio_high: Optional[float]
    clip_ratio_c: float
    tau_pos: float
    tau_neg: float
    freeze_vision_tower: bool
    use_gpg_loss: bool  # verl's first GPG switch; policy_loss.loss_mode=gpg is the current spelling
    policy_loss: PolicyLossConfig
    loss_agg_mode: str
    loss_scale_factor: Optional[float]
    entropy_coeff: float
    calculate_entropy: bool
    calculate_sum_pi_squared: bool  # Σ_v π² per token from the log-prob pass (OTB's energy)
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    ppo_epochs: int
    shuffle: bool
    data_loader_seed: int
    use_torch_compile: bool
    use_fused_kernels: bool
    use_remove_padding: bool
    grad_clip: float
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    max_consecutive_skipped_steps: int
    checkpoint: CheckpointContents
    optim: OptimConfig
    fsdp_config: FSDPConfig
    profiler: dict


@dataclass(**KW)
class RefConfig:
    strategy: str
    use_torch_compile: bool
    log_prob_micro_batch_size: Optional[int]
    log_prob_micro_batch_size_per_gpu: Optional[int]
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_checkpointing: bool
    model: Optional[dict]
    fsdp_config: FSDPConfig
    profiler: dict


# ----------------------------------------------------------------------------- rollout
@dataclass(**KW)
class SamplingConfig:
    top_k: int
    top_p: float
    temperature: float
    n: int
    do_sample: bool


@dataclass(**KW)
class MultiTurnConfig:
    enable: bool
    max_assistant_turns: Optional[int]
    max_user_turns: Optional[int]
    max_parallel_calls: int
    max_tool_response_length: int
    tool_response_truncate_side: str
    tool_config_path: Optional[str]
    interaction_config_path: Optional[str]
    use_inference_chat_template: bool
    tokenization_sanity_check_mode: str
    format: str
    num_repeat_rollouts: Optional[int]


@dataclass(**KW)
class AgentLoopConfig:
    num_workers: Optional[int]  # null: min(8, CPUs) -- see hybridflow.agents.loop_manager.agent_worker_count
    default_agent_loop: str
    agent_loop_config_path: Optional[str]
    custom_async_server: PathName


@dataclass(**KW)
class CheckpointEngineConfig:
    backend: str
    update_weights_bucket_megabytes: int
    engine_kwargs: dict


@dataclass(**KW)
class TraceConfig:
    backend: Optional[str]
    token2text: bool
    max_samples_per_step_per_worker: Optional[int]


@dataclass(**KW)
class RolloutConfig:
    name: str
    mode: str
    n: int
    temperature: float
    top_k: int
    top_p: float
    do_sample: bool
    prompt_length: int
    response_length: int
    dtype: str
    gpu_memory_utilization: float
    ignore_eos: bool
    enforce_eager: bool
    cudagraph_capture_sizes: Optional[list]
    free_cache_engine: bool
    tensor_model_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int
    pipeline_model_parallel_size: int
    max_num_batched_tokens: int
    max_model_len: Optional[int]
    max_num_seqs: int
    max_batch_size: Optional[int]
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    load_format: str
    layered_summon: bool
    multi_stage_wake_up: bool
    log_prob_micro_batch_size: Optional[int]
    log_prob_micro_batch_size_per_gpu: Optional[int]
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    disable_log_stats: bool
    over_sample_rate: float
    calculate_log_probs: bool
    seed: int
    engine_kwargs: dict
    val_kwargs: SamplingConfig
    multi_turn: MultiTurnConfig
    agent: AgentLoopConfig
    checkpoint_engine: CheckpointEngineConfig
    update_weights_bucket_megabytes: int
    trace: TraceConfig
    skip_rollout: bool
    skip_dump_dir: str
    skip_tokenizer_init: bool
    enable_rollout_routing_replay: bool
    quantization: Optional[str]
    profiler: dict


@dataclass(**KW)
class ActorRolloutRefConfig:
    hybrid_engine: bool
    nccl_timeout: int
    model: ModelConfig
    actor: ActorConfig
    ref: RefConfig
    rollout: RolloutConfig


# ----------------------------------------------------------------------------- critic / RM
@dataclass(**KW)
class CriticModelConfig:
    path: str
    tokenizer_path: Optional[str]
    override_config: dict
    external_lib: Optional[str]
    trust_remote_code: bool
    use_shm: bool
    enable_gradient_checkpointing: bool
    enable_activation_offload: bool
    use_remove_padding: bool
    lora_rank: int
    lora_alpha: float
    target_modules: Any
    fsdp_config: FSDPConfig


@dataclass(**KW)
class CriticConfig:
    enable: Optional[bool]
    strategy: str
    rollout_n: int
    ppo_mini_batch_size: int
    ppo_micro_batch_size: Optional[int]
    ppo_micro_batch_size_per_gpu: Optional[int]
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int
    forward_max_token_len_per_gpu: int
    forward_micro_batch_size: Optional[int]
    forward_micro_batch_size_per_gpu: Optional[int]
    ppo_epochs: int
    shuffle: bool
    data_loader_seed: int
    cliprange_value: float
    loss_agg_mode: str
    ulysses_sequence_parallel_size: int
    grad_clip: float
    checkpoint: CheckpointContents
    optim: OptimConfig
    model: CriticModelConfig
    profiler: dict


@dataclass(**KW)
class RewardModelModelConfig(PrimeRewardModelModelKeys):
    input_tokenizer: Optional[str]
    path: str
    external_lib: Optional[str]
    trust_remote_code: bool
    override_config: dict
    use_shm: bool
    use_remove_padding: bool
    use_fused_kernels: bool
    fsdp_config: FSDPConfig


@dataclass(**KW)
class SandboxFusionConfig:
    url: Optional[str]
    max_concurrent: int
    memory_limit_mb: int


@dataclass(**KW)
class RewardModelRolloutConfig:
    """verl's reward loop serving a generative reward model (a judge) from an inference engine: ``name`` (hf |
    vllm) starts ``reward_model.model.path`` on the rollout service; reward functions reach it through the judge
    router (``hybridflow/rewards/judge.py``).  ``prompt_length`` / ``response_length`` bound a judge request,
    ``temperature`` / ``top_p`` / ``top_k`` are the defaults of requests that set none."""

    name: Optional[str]
    dtype: str
    gpu_memory_utilization: float
    enforce_eager: bool
    tensor_model_parallel_size: int
    max_num_seqs: int
    load_format: str
    prompt_length: int
    response_length: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    engine_kwargs: dict


@dataclass(**KW)
class RewardModelConfig(PrimeRewardModelKeys):
    enable: bool
    enable_resource_pool: bool
    n_gpus_per_node: int
    nnodes: int
    strategy: str
    model: RewardModelModelConfig
    micro_batch_size: Optional[int]
    micro_batch_size_per_gpu: Optional[int]
    max_length: Optional[int]
    use_dynamic_bsz: bool
    forward_max_token_len_per_gpu: int
    reward_manager: str
    reward_kwargs: dict
    launch_reward_fn_async: bool
    num_workers: int
    timeout_s: float
    error_score: float
    use_reward_loop: bool
    sandbox_fusion: SandboxFusionConfig
    ulysses_sequence_parallel_size: int
    rollout: RewardModelRolloutConfig
    judge: JudgeConfig
    profiler: dict


@dataclass(**KW)
class CustomRewardFunctionConfig:
    path: Optional[str]
    name: str


# ----------------------------------------------------------------------------- algorithm
@dataclass(**KW)
class KLControlConfig:
    type: str
    kl_coef: float
    horizon: int
    target_kl: float


@dataclass(**KW)
class PFPPOConfig:
    reweight_method: str
    weight_pow: float


@dataclass(**KW)
class FilterGroupsConfig:
    enable: bool
    metric: Optional[str]
    max_num_gen_batches: int


@dataclass(**KW)
class RolloutCorrectionConfig:
    rollout_is: Optional[str]
    rollout_is_threshold: float
    rollout_rs: Optional[str]
    rollout_rs_threshold: Optional[float]
    rollout_is_batch_normalize: bool
    bypass_mode: bool
    loss_type: str


@dataclass(**KW)
class AlgoConfig(AlgoRecipeKeys):
    gamma: float
    lam: float
    adv_estimator: str
    norm_adv_by_std_in_grpo: bool
    use_kl_in_reward: bool
    kl_penalty: str
    kl_ctrl: KLControlConfig
    use_pf_ppo: bool
    pf_ppo: PFPPOConfig
    filter_groups: FilterGroupsConfig
    rollout_correction: RolloutCorrectionConfig


# ----------------------------------------------------------------------------- trainer
@dataclass(**KW)
class TrainerConfig(TrainerRecipeKeys):
    backend: str
    device: str
    balance_batch: bool
    total_epochs: int
    total_training_steps: Optional[int]
    project_name: str
    experiment_name: str
    logger: Any  # a list of backend names; verl also takes one bare name (logger=console)
    log_val_generations: int
    rollout_data_dir: Optional[str]
    validation_data_dir: Optional[str]
    nnodes: int
    n_gpus_per_node: int
    save_freq: int
    esi_redundant_time: float
    resume_mode: str
    resume_from_path: Optional[str]
    val_before_train: bool
    val_only: bool
    test_freq: int
    critic_warmup: int
    default_hdfs_dir: Optional[str]
    del_local_ckpt_after_load: bool
    default_local_dir: str
    max_actor_ckpt_to_keep: Optional[int]
    max_critic_ckpt_to_keep: Optional[int]
    ray_wait_register_center_timeout: int
    use_legacy_worker_impl: Any  # "auto" | "enable" | "disable" (verl scripts also write False); inert here
    seed: int
    report: bool
    tolerated_failure_fraction: float  # hybridflow-only: see hybridflow.trainer.step_failures


@dataclass(**KW)
class RolloutPoolConfig:
    """verl's top-level ``rollout`` node of its async configs: the standalone rollout pool and the fully
    async rollouter's horizon."""

    nnodes: int
    n_gpus_per_node: int
    total_rollout_steps: Optional[int]
    total_epochs: int
    test_freq: int


@dataclass(**KW)
class AsyncCheckpointEngineConfig:
    enable: bool
    device_buffer_size_M: int
    overlap_broadcast_and_consume: bool


@dataclass(**KW)
class AsyncTrainingConfig:
    """verl's ``async_training`` node, plus ``mode`` (which controller runs: verl picks it by entry point)."""

    mode: str
    staleness_threshold: float
    trigger_parameter_sync_step: int
    require_batches: int
    partial_rollout: bool
    use_rollout_log_probs: bool
    compute_prox_log_prob: bool
    use_trainer_do_validate: bool
    checkpoint_engine: AsyncCheckpointEngineConfig


@dataclass(**KW)
class RayKwargsConfig:
    ray_init: dict
    timeline_json_file: Optional[str]


@dataclass(**KW)
class PPOConfig:
    data: DataConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    algorithm: AlgoConfig
    trainer: TrainerConfig
    global_profiler: dict
    ray_kwargs: RayKwargsConfig
    rollout: RolloutPoolConfig
    async_training: AsyncTrainingConfig
    distillation: DistillationConfig

    @property
    def use_critic(self) -> bool:
        """verl's rule: an explicit ``critic.enable`` wins, otherwise a critic iff GAE."""
        if self.critic.enable is not None:
            return bool(self.critic.enable)
        if self.trainer.recipe in ("spin", "prime"):  # DPO pairs / PRIME's RLOO: no value function
            return False
        return self.algorithm.adv_estimator == "gae"

    @property
    def uses_judge(self) -> bool:
        """A generative reward model served on the rollout service and asked by the reward function (verl's rule:
        ``reward_model.rollout.name`` set and a ``custom_reward_function``; without one the served model is a
        discriminative RM, scored by the reward-model worker)."""
        rm = self.reward_model
        return bool(rm.enable) and rm.rollout.name is not None and bool(self.custom_reward_function.path)

    @property
    def split_placement(self) -> bool:
        """Rollout replicas on their own pool (verl's ``actor_rollout_ref.hybrid_engine=false``)."""
        return not self.actor_rollout_ref.hybrid_engine

    @property
    def use_reference_policy(self) -> bool:
        """A reference model is needed when KL is used (as a loss or in the reward) and by SPIN's DPO loss."""
        return (self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward
                or self.trainer.recipe == "spin")
