"""Configuration: verl's key tree as YAML defaults, Hydra overrides, typed dataclasses, validation."""

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
from hybridflow.config.validate import ConfigWarning, n_devices, validate_config

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgoConfig", "CONFIG_DIR", "CommandLine", "ConfigError",
    "ConfigWarning", "CriticConfig", "DataConfig", "FSDPConfig", "ModelConfig", "OptimConfig", "PPOConfig",
    "RefConfig", "RewardModelConfig", "RolloutConfig", "TrainerConfig", "build_dataclass", "compose_raw",
    "config_to_dict", "load_config", "n_devices", "parse_command_line", "validate_config",
]
