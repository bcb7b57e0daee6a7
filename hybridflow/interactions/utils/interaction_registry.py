"""Build interactions from verl's interaction YAML (``rollout.multi_turn.interaction_config_path``).

    interaction:
      - name: gsm8k                                                    # optional, see below
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}

``class_name`` is ``package.module.Class``; a path starting with ``verl.`` is read with ``hybridflow.`` in its
place. Without ``name``, the class name lower-cased without an ``Interaction`` suffix is used (verl's rule:
``Gsm8kInteraction`` -> ``gsm8k``). The name is added to the instance's config. Samples pick an interaction
with ``extra_info.interaction_kwargs.name``.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from hybridflow.interactions.base import BaseInteraction
from hybridflow.utils.load_object import load_object

_ENTRY_KEYS = {"name", "class_name", "config"}


def get_interaction_class(cls_name: str) -> Any:
    """verl's loader: the object at ``package.module.Name`` (``verl.`` read as ``hybridflow.``); a missing
    module raises ``ModuleNotFoundError``, a missing name ``AttributeError``, as in verl."""
    return load_object(cls_name, key="interaction class_name", kind="interaction class")


def resolve_interaction_class(class_name: str, where: str) -> type[BaseInteraction]:
    """``package.module.Class`` (verl's form), ``module:Class`` or ``file.py:Class``; errors name ``where``."""
    from hybridflow.utils.load_object import load_object

    if "." not in str(class_name) and ":" not in str(class_name):
        raise ValueError(f"{where}: class_name {class_name!r} must be a 'package.module.Class' path")
    return load_object(str(class_name), key=f"{where}: class_name", kind="interaction class",
                       expect=_interaction_class)


def _interaction_class(obj: Any) -> str | None:
    if isinstance(obj, type) and issubclass(obj, BaseInteraction):
        return None
    return "must be a subclass of hybridflow.interactions.base.BaseInteraction"


def default_name(class_name: str) -> str:
    simple = str(class_name).rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def interaction_from_entry(entry: Any, where: str) -> tuple[str, BaseInteraction]:
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ValueError(f"{where}: each interaction needs 'class_name' (and optionally 'name', 'config'), "
                         f"got {entry!r:.200}")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; an interaction entry has name, class_name, config")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: 'config' must be a mapping, got {type(config).__name__}")
    cls = resolve_interaction_class(entry["class_name"], where)
    name = str(entry["name"]) if entry.get("name") else default_name(entry["class_name"])
    try:
        return name, cls(config={**config, "name": name})
    except Exception as e:
        raise ValueError(f"{where} ({entry['class_name']}): {e}") from e


def initialize_interactions_from_config(interaction_config_file: str | os.PathLike) -> dict[str, BaseInteraction]:
    """``{name: interaction}`` for every entry of the file, in order; names must be unique."""
    path = os.fspath(interaction_config_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"interaction config {path!r} does not exist "
                                "(rollout.multi_turn.interaction_config_path)")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("interaction"), list):
        raise ValueError(f"{path}: expected a top-level 'interaction:' list of entries "
                         "(name, class_name, config)")
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(data["interaction"]):
        name, interaction = interaction_from_entry(entry, f"{path}: interaction[{i}]")
        if name in interactions:
            raise ValueError(f"{path}: Duplicate interaction name {name!r} found; each interaction needs a unique name")
        interactions[name] = interaction
    return interactions


__all__ = ["default_name", "get_interaction_class", "initialize_interactions_from_config", "interaction_from_entry",
           "resolve_interaction_class"]
