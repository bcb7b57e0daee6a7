"""Configuration, the ground floor: verl's key trees (0.9 and early 2026) as YAML defaults, Hydra overrides, typed
dataclasses, the rules on the configuration's own values (``checks/``), the step plan and the controller mode.
Imports nothing of hybridflow's but ``utils``; the run's ordered check pipeline and ``load_config`` (compose + every
check) are in ``hybridflow.launch.config``."""

from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import (
    CONFIG_DIR,
    CommandLine,
    build_dataclass,
    compose_config,
    compose_raw,
    config_to_dict,
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
from hybridflow.config.checks import ConfigWarning
from hybridflow.config.checks.parallel import n_devices

__all__ = [
    "ActorConfig", "ActorRolloutRefConfig", "AlgoConfig", "CONFIG_DIR", "CommandLine", "ConfigError",
    "ConfigWarning", "CriticConfig", "DataConfig", "FSDPConfig", "ModelConfig", "OptimConfig", "PPOConfig",
    "RefConfig", "RewardModelConfig", "RolloutConfig", "StepPlan", "TrainerConfig", "build_dataclass", "compose_config",
    "compose_raw", "config_to_dict", "n_devices", "parse_command_line", "plan_step",
]
