"""Typed configuration of the model roles: model and FSDP engine, actor, reference, rollout, critic, reward model.

Split from :mod:`hybridflow.config.schema` (which re-exports every class) to keep each file one screenful of
nodes; the conventions are that module's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybridflow.config.optim_schema import OptimConfig  # noqa: F401 - re-exported with the role nodes
from hybridflow.config.recipes import (
    ActorRecipeKeys,
    JudgeConfig,
    PrimeRewardModelKeys,
    PrimeRewardModelModelKeys,
)

KW = dict(kw_only=True)


@dataclass(**KW)
class PathName:
    path: Optional[str]
    name: Optional[str]


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
    # verl 0.9's engine node repeats role settings here (key_policy says which act); defaulted for nodes verl 0.9
    # does not give them (the reward model's) and for code building an FSDP config by hand
    ulysses_sequence_parallel_size: int = 1
    entropy_from_logits_with_chunking: bool = False
    entropy_from_logits_chunk_size: int = 2048
    use_torch_compile: bool = True
    pad_to_length: bool = False
    pad_to_length_bucket: int = 1024
    forward_only: bool = False
    strategy: str = "fsdp"
    qat: dict = field(default_factory=dict)
    turbo_config: dict = field(default_factory=dict)


@dataclass(**KW)
class MegatronConfig:
    """verl's ``<role>.megatron`` node.  With ``<role>.strategy=megatron`` the parallel sizes lay out the torch-native
    N-D engine (tp, ep, pp; context parallelism as Ulysses) and the offload keys act through the role's FSDP settings;
    the rest are Megatron-LM internals, inert or refused (``config/checks/megatron.py``, ``key_policy``)."""

    tensor_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    pipeline_schedule: str = "1f1b"  # hybridflow-only: 1f1b | gpipe (virtual stages: interleaved 1F1B | looped GPipe)
    context_parallel_size: int = 1
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: Optional[str] = None
    dist_checkpointing_prefix: str = ""
    dist_ckpt_optim_fully_reshardable: bool = False
    distrib_optim_fully_reshardable_mem_efficient: bool = False
    dynamic_context_parallel: bool = False
    max_seqlen_per_dp_cp_rank: Optional[int] = None
    entropy_from_logits_with_chunking: bool = False
    entropy_from_logits_chunk_size: int = 2048
    seed: int = 42
    override_ddp_config: dict = field(default_factory=dict)
    override_transformer_config: dict = field(default_factory=dict)
    override_mcore_model_config: dict = field(default_factory=dict)
    use_mbridge: bool = True
    vanilla_mbridge: bool = False
    use_remove_padding: bool = True
    pad_bshd_to_minibatch_max: bool = True
    pad_to_length: bool = False
    pad_to_length_bucket: int = 512
    use_megatron_fsdp: bool = False
    forward_only: bool = False
    dtype: str = "bfloat16"
    router_replay: dict = field(default_factory=dict)
    qat: dict = field(default_factory=dict)


@dataclass(**KW)
class CheckpointContents:
    save_contents: list
    load_contents: list
    async_save: bool
    strict: bool = True  # verl 0.9 has it on the actor only: false loads the tensors model and checkpoint share


@dataclass(**KW)
class FusedKernelOptions:
    impl_backend: str
    chunk_size: int  # hybridflow: rows per chunk of the fused LM head (0: by a 128 MB budget of logits)


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
    enable_gradient_checkpointing: Optional[bool]  # null: decided by memory (engine/activation_memory.py)
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
    tiled_mlp: dict
    mtp: dict
    lora: dict


@dataclass(**KW)
class PolicyLossConfig:
    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    dro_beta: Optional[float]


@dataclass(**KW)
class ActorConfig(ActorRecipeKeys):
    strategy: str
    rollout_n: int
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
    use_prefix_grouper: bool
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
    entropy_from_logits_chunk_size: int
    entropy_checkpointing: bool
    pad_to_length: bool
    max_consecutive_skipped_steps: int
    router_replay: dict
    qat: dict
    checkpoint: CheckpointContents
    optim: OptimConfig
    fsdp_config: FSDPConfig
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # verl's other engines' nodes, mapped onto this role's strategy by config/checks/engines.py
    model_engine: Optional[str] = None
    veomni: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)
    profiler: dict


@dataclass(**KW)
class RefConfig:
    strategy: str
    rollout_n: int
    use_torch_compile: bool
    log_prob_micro_batch_size: Optional[int]
    log_prob_micro_batch_size_per_gpu: Optional[int]
    log_prob_use_dynamic_bsz: bool
    log_prob_max_token_len_per_gpu: int
    ulysses_sequence_parallel_size: int
    entropy_from_logits_with_chunking: bool
    entropy_from_logits_chunk_size: int
    entropy_checkpointing: bool
    pad_to_length: bool
    router_replay: dict
    model: Optional[dict]
    fsdp_config: FSDPConfig
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # verl's other engines' nodes, mapped onto this role's strategy by config/checks/engines.py
    model_engine: Optional[str] = None
    veomni: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)
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
    function_tool_path: Optional[str]
    interaction_config_path: Optional[str]
    use_inference_chat_template: bool
    tokenization_sanity_check_mode: str
    format: str
    num_repeat_rollouts: Optional[int]


@dataclass(**KW)
class AgentLoopConfig:
    num_workers: Optional[int]  # null: min(8, CPUs, one per 256 trajectories) -- see hybridflow.agents.loop_manager.agent_worker_count
    default_agent_loop: str
    agent_loop_config_path: Optional[str]
    custom_async_server: PathName


@dataclass(**KW)
class CheckpointEngineConfig:
    backend: str
    update_weights_bucket_megabytes: int
    engine_kwargs: dict
    custom_backend_module: Optional[str]


@dataclass(**KW)
class TraceConfig:
    project_name: Optional[str]
    experiment_name: Optional[str]
    backend: Optional[str]
    token2text: bool
    max_samples_per_step_per_worker: Optional[int]


@dataclass(**KW)
class RolloutConfig:
    name: str
    mode: str
    nnodes: int
    n_gpus_per_node: int
    full_determinism: bool
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
    # hybridflow-only: the split hf engine's switched shard freed at sleep (null = true; workers/sharded_rollout.py)
    free_weights_on_sleep: Optional[bool]
    tensor_model_parallel_size: Optional[int]  # null: the engine's default (vllm / sglang 2 as in verl, hf 1)
    data_parallel_size: int
    expert_parallel_size: int
    moe_tensor_parallel_size: int = 1  # TensorRT-LLM's; inert here (key_policy)
    pipeline_model_parallel_size: int
    max_num_batched_tokens: int
    max_model_len: Optional[int]
    max_num_seqs: int
    max_batch_size: Optional[int]
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    logprobs_mode: str
    scheduling_policy: str
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
    exact_log_probs: Optional[bool]  # hybridflow: rollout log-probs == the actor's bit for bit (null: where possible)
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
    moe_load_balance_metrics_interval: int
    quantization: Optional[str]
    quantization_config_file: Optional[str]
    mtp: Any
    qat: Any
    prometheus: dict
    disaggregation: dict
    profiler: dict
    stall_timeout_s: float  # hybridflow-only: the generation watchdog (hybridflow.rollout.service.watchdog); 0 = off


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
    hf_config_path: Optional[str]
    tokenizer_path: Optional[str]
    custom_chat_template: Optional[str]
    override_config: dict
    external_lib: Optional[str]
    trust_remote_code: bool
    use_shm: bool
    enable_gradient_checkpointing: Optional[bool]  # null: decided by memory (engine/activation_memory.py)
    enable_activation_offload: bool
    use_remove_padding: bool
    lora_rank: int
    lora_alpha: float
    target_modules: Any
    exclude_modules: Any
    lora_adapter_path: Optional[str]
    use_liger: bool
    use_fused_kernels: bool
    fused_kernel_options: FusedKernelOptions
    tiled_mlp: dict
    mtp: dict
    lora: dict
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
    loss_scale_factor: Optional[float]
    ulysses_sequence_parallel_size: int
    grad_clip: float
    checkpoint: CheckpointContents
    optim: OptimConfig
    model: CriticModelConfig
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    # verl's other engines' nodes, mapped onto this role's strategy by config/checks/engines.py
    model_engine: Optional[str] = None
    veomni: dict = field(default_factory=dict)
    engine: dict = field(default_factory=dict)
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
    router (``hybridflow/rewards/judge.py``).  The engine keys are the actor rollout's (``judge_service.py`` copies
    them onto the judge replicas, and ``config/checks/judge.py`` applies the actor rollout's refusals to them);
    ``prompt_length`` / ``response_length`` bound a judge request; ``temperature`` / ``top_p`` / ``top_k`` /
    ``do_sample`` are the defaults of requests that set none; a judge answers each request once (``n`` = 1)."""

    name: Optional[str]
    dtype: str
    gpu_memory_utilization: float
    enforce_eager: bool
    cudagraph_capture_sizes: Optional[list]
    free_cache_engine: bool
    data_parallel_size: int
    expert_parallel_size: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    max_num_batched_tokens: int
    max_model_len: Optional[int]
    max_num_seqs: int
    load_format: str
    layered_summon: bool
    scheduling_policy: str
    full_determinism: bool
    seed: int
    multi_stage_wake_up: bool
    engine_kwargs: dict
    limit_images: Optional[int]
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    disable_log_stats: bool
    skip_tokenizer_init: bool
    ignore_eos: bool
    temperature: float
    top_k: int
    top_p: float
    do_sample: bool
    n: int
    prompt_length: int
    response_length: int
    quantization: Optional[str]
    quantization_config_file: Optional[str]
    mtp: Any
    disaggregation: dict


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
    reward_loop_source: str           # register (reward_manager is a registered name) | importlib (a class from a file)
    reward_loop_module_path: Optional[str]
    reward_loop_class_name: str
    reward_kwargs: dict
    launch_reward_fn_async: bool
    num_workers: int
    timeout_s: float
    error_score: float
    worker_memory_mb: int  # hybridflow-only: a scoring process past this resident memory is replaced
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
