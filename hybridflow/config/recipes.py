"""The keys of the recipes built on the PPO step: SPIN, SPPO and PRIME (verl-recipe's names), on-policy
distillation (verl 0.9's ``distillation.*``) and the generative reward model's limits.

The fields live here, as mixins of the node classes in ``schema.py`` (``ActorConfig(ActorRecipeKeys, ...)``), so
the recipe keys are declared in one place.  Their defaults are in ``ppo_trainer.yaml`` beside verl's;
``trainer.recipe`` (set by the recipes' entry points, ``python -m hybridflow.recipe.<name>.main_<name>``) selects
which controller variant reads them, and ``config/checks/recipes.py`` refuses a recipe key set for a run whose recipe
does not read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridflow.config.optim_schema import OptimConfig

KW = dict(kw_only=True)

RECIPES = ("spin", "sppo", "prime")

__all__ = ["RECIPES", "ActorRecipeKeys", "AlgoRecipeKeys", "TrainerRecipeKeys", "DataRecipeKeys",
           "PrimeOptimConfig", "PrimeRewardModelModelKeys", "PrimeRewardModelKeys", "DistillationLossConfig",
           "DistillationConfig", "JudgeConfig"]


@dataclass(**KW)
class ActorRecipeKeys:
    dpo_beta: float  # SPIN: the DPO temperature beta (verl-recipe reads it from the actor node)
    sppo_eta: float  # SPPO: eta, the scale of the regression target eta * (R - softmean(R))


@dataclass(**KW)
class AlgoRecipeKeys:
    dpo_loss_type: str  # SPIN: sigmoid | ipo
    dpo_label_smoothing: float  # SPIN: conservative DPO's epsilon (sigmoid loss)
    dpo_pairs: str  # SPIN: reward (two samples, chosen by reward; verl-recipe) | reference (the dataset's answer vs a
    #                 sample: SPIN's self-play against the target data)
    dpo_reference_field: str  # SPIN with dpo_pairs=reference: where the answer is (reward_model.ground_truth or
    #                           extra_info.<key>)
    sppo_eta: float  # SPPO: beta of the soft mean (verl-recipe's algorithm.sppo_eta)
    sppo_softmean_scope: str  # SPPO: batch (verl-recipe) | group (per prompt, the paper's centring)
    reward_gt_coef: float  # PRIME: weight of the outcome labels' RLOO advantage
    reward_dpo_coef: float  # PRIME: weight of the implicit process rewards' RLOO advantage


@dataclass(**KW)
class TrainerRecipeKeys:
    recipe: Optional[str]  # null (PPO/GRPO...) | spin | sppo | prime
    ref_update_freq: int  # > 0: the reference model takes the actor's weights every this many steps (SPIN)
    log_freq: int  # a step's metrics reach trainer.logger every this many steps (verl-recipe SPIN's +trainer.log_freq)


@dataclass(**KW)
class DataRecipeKeys:
    filter_accuracy: bool  # PRIME: keep prompts whose sampled accuracy is within the bounds first
    accuracy_lower_bound: float
    accuracy_upper_bound: float
    oversample_factor: float  # PRIME: prompts are drawn this many times the batch size; the best 1/factor train
    filter_truncate: bool  # PRIME: prompts with a truncated response go last


@dataclass(**KW)
class PrimeOptimConfig(OptimConfig):
    """The implicit PRM's optimiser (verl-recipe's ``reward_model.model.optim``): the actor's keys plus ``grad_clip``."""

    grad_clip: float


@dataclass(**KW)
class PrimeRewardModelModelKeys:
    ref_path: Optional[str]  # PRIME: the frozen reference of the implicit PRM (default: the PRM's own start)
    ref_type: str  # freeze (the only one verl-recipe runs)
    update: str  # none | before | after: when the PRM trains on the step's labels relative to scoring
    beta_train: float  # beta of the implicit reward beta * log(pi_phi / pi_ref)
    loss_type: str  # ce
    optim: PrimeOptimConfig
    tokenizer_path: Optional[str]
    enable_gradient_checkpointing: Optional[bool]  # null: decided by memory (engine/activation_memory.py)


@dataclass(**KW)
class PrimeRewardModelKeys:
    mini_batch_size: int  # PRIME: PRM update mini-batch (prompts)
    prime_granularity: str  # token | whole
    prime_norm: str  # batch_norm | none


@dataclass(**KW)
class JudgeConfig:
    """``reward_model.judge``: limits on the requests reward functions send to a generative reward model served on
    the rollout service (``reward_model.rollout.name`` set); verl's ``limited`` reward manager has the same three."""

    max_concurrent: int  # judge requests in flight at once, all scorers together (<= 0: no limit)
    max_rpm: Optional[float]  # judge requests per minute (token bucket; null: no limit)
    max_tpm: Optional[float]  # judge tokens (prompt + generated) per minute (null: no limit)
    request_timeout_s: float  # one judge request, queueing included; past it the request fails (JudgeTimeout)


@dataclass(**KW)
class DistillationLossConfig:
    loss_mode: str
    topk: Optional[int]
    use_task_rewards: bool
    distillation_loss_coef: float
    loss_max_clamp: Optional[float]
    log_prob_min_clamp: Optional[float]
    use_policy_gradient: bool
    policy_loss_mode: str
    clip_ratio: float
    clip_ratio_low: float
    clip_ratio_high: float


@dataclass(**KW)
class DistillationConfig:
    """verl 0.9's on-policy distillation node.  ``teacher_models`` maps an entry name to ``{key, model_path,
    num_replicas, inference: {...}}``; it stays a mapping because verl's command lines add entries with
    ``+distillation.teacher_models.<name>.*`` (read by ``trainer/teachers.py``)."""

    enabled: bool
    distillation_loss: DistillationLossConfig
    n_gpus_per_node: int
    nnodes: int
    teacher_models: dict
    teacher_key: str
