"""The ``_target_`` lines of verl config files (its recipes' YAMLs, a copy of its ``ppo_trainer.yaml``).

verl turns each config node into the dataclass its ``_target_`` names (``verl.trainer.config.FilterGroupsConfig``,
``verl.workers.config.FSDPActorConfig``, ...).  hybridflow builds every node from its own schema
(``config/schema*.py``), which holds the counterpart of each of verl's config classes at the same place in the
tree, so a ``_target_`` naming one of verl's (or hybridflow's) classes adds nothing and is dropped.  One naming a
class of the user's own would swap in a different config type; that is refused, naming the node.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig

from hybridflow.config.errors import ConfigError

__all__ = ["drop_config_targets"]

_OURS = ("verl.", "hybridflow.")


def drop_config_targets(cfg: DictConfig) -> None:
    """Remove every ``_target_`` that names a verl / hybridflow config class, in place; a foreign one is an error."""
    foreign: list[str] = []
    _walk(cfg, "", foreign)
    if foreign:
        raise ConfigError([f"{key}={value!r}: a config class of your own is not supported; hybridflow builds that "
                           "node from its schema (the counterpart of verl's config class). Remove the _target_ line "
                           "and keep the node's keys" for key, value in foreign])


def _walk(node: Any, prefix: str, foreign: list[tuple[str, Any]]) -> None:
    if isinstance(node, DictConfig):
        for key in list(node.keys()):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key == "_target_":
                value = node._get_node(key)._value()
                if isinstance(value, str) and value.startswith(_OURS):
                    node.pop(key)
                else:
                    foreign.append((path, value))
                continue
            _walk(node._get_node(key), path, foreign)
    elif isinstance(node, ListConfig):
        for i in range(len(node)):
            _walk(node._get_node(i), f"{prefix}[{i}]", foreign)
