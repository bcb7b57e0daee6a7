"""The optimizer node every trained role shares (``actor.optim``, ``critic.optim``, PRIME's
``reward_model.model.optim``): one dataclass, so a key added here acts for all of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["OptimConfig"]

KW = dict(kw_only=True)


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
    zero_indexed_step: bool = True  # the cosine schedule counts optimizer steps from 0 (False: from 1, as torchtitan)
    # Megatron's optimizer keys (verl's optim/megatron.yaml): lr_decay_style / min_lr act (config/checks/megatron.py)
    lr_decay_style: Optional[str] = None
    min_lr: Optional[float] = None
    lr_warmup_init: float = 0.0
    lr_decay_steps: Optional[int] = None
    weight_decay_incr_style: str = "constant"
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_steps: Optional[int] = None
    use_checkpoint_opt_param_scheduler: bool = False
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    use_layer_wise_distributed_optimizer: bool = False
