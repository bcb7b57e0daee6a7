"""The SFT trainer's config: verl's ``sft_trainer.yaml`` keys (as its ``fsdp_sft_trainer`` read them).

``load_sft_config(["data.train_files=...", "model.partial_pretrain=...", ...])`` types the overrides against
the dataclasses below; an unknown key is an error naming it. verl keys hybridflow does not implement are
refused with the reason (``ulysses_sequence_parallel_size`` > 1).  ``use_remove_padding`` packs each micro-batch
into one row, as the RL actor does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

__all__ = [
    "SFTConfig",
    "SFTDataConfig",
    "SFTModelConfig",
    "SFTMultiturnConfig",
    "SFTOptimConfig",
    "SFTTrainerConfig",
    "load_sft_config",
]


@dataclass
class SFTMultiturnConfig:
    enable: bool = False
    messages_key: str = "messages"
    tools_key: str = "tools"  # per-row tool schemas rendered by the chat template (a missing column: no tools)


@dataclass
class SFTDataConfig:
    train_files: Any = None
    val_files: Any = None
    prompt_key: str = "prompt"
    response_key: str = "response"
    # verl: the prompt / response column holds a dict; these keys are looked up in it, one after the other
    # (``data.prompt_key=extra_info data.prompt_dict_keys=['question']``)
    prompt_dict_keys: Optional[list] = None
    response_dict_keys: Optional[list] = None
    multiturn: SFTMultiturnConfig = field(default_factory=SFTMultiturnConfig)
    max_length: int = 1024
    truncation: str = "error"
    train_batch_size: int = 256
    micro_batch_size: Optional[int] = None  # verl's deprecated spelling of micro_batch_size_per_gpu
    micro_batch_size_per_gpu: int = 4
    shuffle: bool = True


@dataclass
class SFTModelConfig:
    partial_pretrain: str = ""
    trust_remote_code: bool = False
    dtype: str = "fp32"
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank instead of the whole model
    lora_alpha: int = 16
    target_modules: Any = "all-linear"  # "all-linear", a regex, or a list of module names


@dataclass
class SFTOptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    clip_grad: float = 1.0
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler: str = "cosine"
    min_lr_ratio: float = 0.0


@dataclass
class SFTTrainerConfig:
    default_local_dir: str = "checkpoints/sft"
    project_name: str = "hybridflow_sft"
    experiment_name: str = "sft"
    total_epochs: int = 1
    total_training_steps: Optional[int] = None
    logger: Any = field(default_factory=lambda: ["console"])  # a list, or one name (verl: trainer.logger=console)
    seed: int = 1
    save_hf_model: bool = True
    test_freq: int = -1  # validation loss on data.val_files every N steps (and always after the last)
    device: str = "auto"  # auto | cpu | cuda
    # data-parallel processes per node and nodes; unset: what torchrun started (verl's scripts set neither), else 1
    n_gpus_per_node: Optional[int] = None
    nnodes: Optional[int] = None


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    ulysses_sequence_parallel_size: int = 1
    use_remove_padding: bool = False


def load_sft_config(overrides: Sequence[str]) -> SFTConfig:
    """Defaults + ``key=value`` overrides (typed by the dataclasses; an unknown key is an error)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    base = OmegaConf.structured(SFTConfig)
    cleaned = [o.lstrip("+") for o in overrides]
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(cleaned))
    except (ConfigKeyError, ValidationError) as e:
        raise ValueError(f"bad SFT override: {e}".split("\n")[0] + " (keys follow verl's sft_trainer.yaml)") from e
    config: SFTConfig = OmegaConf.to_object(merged)
    _normalize(config)
    return config


def _normalize(config: SFTConfig) -> None:
    d, t, m = config.data, config.trainer, config.model
    if config.ulysses_sequence_parallel_size != 1:
        raise ValueError(f"ulysses_sequence_parallel_size={config.ulysses_sequence_parallel_size}: Ulysses sequence "
                         "parallelism is not implemented, every device holds whole sequences. Drop the key (or set 1) "
                         "and lower data.max_length or data.micro_batch_size_per_gpu if memory is short")
    if d.micro_batch_size is not None:
        warnings.warn(f"data.micro_batch_size={d.micro_batch_size} is verl's deprecated spelling; using it as "
                      "data.micro_batch_size_per_gpu", UserWarning, stacklevel=3)
        d.micro_batch_size_per_gpu = int(d.micro_batch_size)
    for name in ("prompt_dict_keys", "response_dict_keys"):
        keys = getattr(d, name)
        if isinstance(keys, str):
            setattr(d, name, [keys])
    t.logger = [t.logger] if isinstance(t.logger, str) else list(t.logger)
    if t.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"trainer.device={t.device!r} must be auto, cpu or cuda")
    if (t.n_gpus_per_node is not None and t.n_gpus_per_node < 1) or (t.nnodes is not None and t.nnodes < 1):
        raise ValueError(f"trainer.n_gpus_per_node={t.n_gpus_per_node} and trainer.nnodes={t.nnodes} must be >= 1")
    if m.lora_rank < 0:
        raise ValueError(f"model.lora_rank={m.lora_rank} must be >= 0 (0 trains the whole model)")
    if isinstance(m.target_modules, str) and m.target_modules.startswith("[") and m.target_modules.endswith("]"):
        m.target_modules = [s.strip() for s in m.target_modules[1:-1].split(",") if s.strip()]

