"""Configuration: verl's key trees (0.9 and early 2026) as YAML defaults, Hydra overrides, typed dataclasses, the check
pipeline (``checks/``) and the step plan."""

from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import (
    CONFIG_DIR,
    CommandLine,
    build_dataclass,
    compose_raw,
    config_to_dict,
    load_config,
    parse_command_line,
)
from hybridflow.config.schema import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgoConfig,
    CriticConfig,
    DataConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    PPOConfig,
    RefConfig,
    RewardModelConfig,
    RolloutConfig,
    TrainerConfig,
)
from hybridflow.config.plan import StepPlan, plan_step
from hybridflow.config.validate import ConfigWarning, n_devices, validate_config

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgoConfig", "CONFIG_DIR", "CommandLine", "ConfigError",
    "ConfigWarning", "CriticConfig", "DataConfig", "FSDPConfig", "ModelConfig", "OptimConfig", "PPOConfig",
    "RefConfig", "RewardModelConfig", "RolloutConfig", "StepPlan", "TrainerConfig", "build_dataclass", "compose_raw",
    "config_to_dict", "load_config", "n_devices", "parse_command_line", "plan_step", "validate_config",
]
