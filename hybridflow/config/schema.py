"""Typed configuration: one dataclass per node of the verl key tree.

Defaults live in ``ppo_trainer.yaml`` (one source, as in verl, with the same interpolations); these
classes give every key a type so a typo or a wrong type fails at start-up with a precise message
instead of deep inside a worker. Field names are verl's, so worker code ports unchanged.
Free-form nodes (``override_config``, ``engine_kwargs``, ``reward_kwargs``...) are ``dict``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from hybridflow.config.recipes import AlgoRecipeKeys, DataRecipeKeys, DistillationConfig, TrainerRecipeKeys
from hybridflow.config.schema_roles import (  # noqa: F401 - re-exported: the role nodes live there
    ActorConfig,
    ActorRolloutRefConfig,
    AgentLoopConfig,
    CheckpointContents,
    CheckpointEngineConfig,
    CriticConfig,
    CriticModelConfig,
    CustomRewardFunctionConfig,
    FSDPConfig,
    FusedKernelOptions,
    MegatronConfig,
    MixedPrecisionConfig,
    ModelConfig,
    MultiTurnConfig,
    OptimConfig,
    PathName,
    PolicyLossConfig,
    RefConfig,
    RewardModelConfig,
    RewardModelModelConfig,
    RewardModelRolloutConfig,
    RolloutConfig,
    SamplingConfig,
    SandboxFusionConfig,
    TraceConfig,
    WrapPolicy,
)

KW = dict(kw_only=True)


# ----------------------------------------------------------------------------- data


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
    gen_batch_size: Optional[int]  # null (verl 0.9's default) = train_batch_size, filled by the check pipeline
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
    max_row_bytes: int  # hybridflow: rows larger than this are refused when read (before tokenizing)
    image_key: str
    video_key: str
    audio_key: str
    image_patch_size: int
    mm_processor_kwargs: dict
    trust_remote_code: bool
    return_multi_modal_inputs: bool
    custom_cls: PathName
    sampler: SamplerConfig
    datagen: PathName
    apply_chat_template_kwargs: dict
    tool_config_path: Optional[str]
    function_tool_path: Optional[str]

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
    max_inflight_gen_batches: int


@dataclass(**KW)
class RolloutCorrectionConfig:
    rollout_is: Optional[str]
    rollout_is_threshold: Any  # a number, or verl 0.9's 'lower_upper' string (IcePop)
    rollout_rs: Optional[str]  # one criterion or several, comma-separated (algorithms/rollout_thresholds.py)
    rollout_rs_threshold: Any  # a number, 'lower_upper', or one of those per criterion, comma-separated
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
    gdpo_reward_keys: Optional[list]  # adv_estimator=gdpo: the reward function's dict entries, normalised apart
    gdpo_reward_weights: Optional[list]  # their weights (null: equal)


# ----------------------------------------------------------------------------- trainer


@dataclass(**KW)
class RolloutWalConfig:
    """hybridflow-only: the rollout log of the async and V1 modes (hybridflow/trainer/durable/rollout_log.py)."""

    enable: bool
    max_mb: float


@dataclass(**KW)
class PrometheusConfig:
    """``trainer.prometheus``: where the ``prometheus`` logger serves ``/metrics`` (hybridflow/tracking/prometheus.py)."""

    host: str
    port: int
    drift_threshold: float  # max |p_rollout - p_actor| of a step above which the step counts as drift


@dataclass(**KW)
class DriftConfig:
    """``trainer.drift``: the rollout vs trainer log-prob drift check and the engines' weight digests
    (hybridflow.trainer.drift, docs/drift.md)."""

    enable: bool
    action: str  # stop | warn
    warn: Optional[float]  # null: the measured level of the run's engine x dtype
    stop: Optional[float]
    check_weights: bool


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
    overwrite_checkpoints: bool
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
    prometheus: PrometheusConfig
    tolerated_failure_fraction: float  # hybridflow-only: see hybridflow.trainer.step_failures
    import_modules: list  # user modules (dotted or .py) imported in every process: they register extensions
    use_v1: bool  # verl 0.9's V1 trainer (hybridflow.config.v1); false = the same synchronous trainer as sync
    v1: dict  # verl 0.9's trainer.v1 node, read and checked by hybridflow.config.v1
    rollout_wal: RolloutWalConfig  # hybridflow-only: generated samples durable until trained (async, V1 modes)
    async_validation: bool  # hybridflow-only: validation on its own thread, training does not wait (async modes)
    drift: DriftConfig  # hybridflow-only: the drift detector and weight digests (docs/drift.md)


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
    model_engine: str  # verl 0.9's engine selector: dp (FSDP, what hybridflow trains with)
    distillation: DistillationConfig  # verl 0.9's on-policy distillation (trainer/teachers.py)
    transfer_queue: dict  # verl 0.9's V1 data plane: refused when enabled
    skip: dict  # verl 0.9's rollout dump/replay: refused when enabled

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
