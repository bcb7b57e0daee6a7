"""Build tool objects from verl's tool-config YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``).

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool      # a class path, or a registered name: calc_gsm8k_reward
        config: {type: native}
        tool_schema: {type: function, function: {name: calc_gsm8k_reward, description: ..., parameters: ...}}

verl users keep their files: class paths of verl's built-in tools (``verl.tools.*`` or the same path with
``hybridflow`` in place of ``verl``) resolve to our equivalents; any other dotted path is imported, so custom
tools written against :class:`hybridflow.tools.base_tool.BaseTool` work as in verl. ``tool_schema`` may be omitted
for built-in tools (their default schema is used).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import yaml

from hybridflow.tools.base_tool import TOOL_REGISTRY, BaseTool

# verl's built-in tool classes -> our registered tool names (matched on the class name of any verl path).
VERL_TOOL_ALIASES = {
    "Gsm8kTool": "calc_gsm8k_reward",
    "SandboxFusionTool": "code_interpreter",
    "SearchTool": "search",
}


def resolve_tool_class(class_name: str) -> type[BaseTool]:
    """A registered name, a verl built-in class path, or an importable ``module.Class`` path."""
    if class_name in TOOL_REGISTRY:
        return TOOL_REGISTRY.get(class_name)
    module_name, _, attr = class_name.rpartition(".")
    root = module_name.split(".")[0]
    if root in ("verl", "hybridflow") and attr in VERL_TOOL_ALIASES:
        return TOOL_REGISTRY.get(VERL_TOOL_ALIASES[attr])
    if not module_name:
        raise ValueError(f"tool class_name {class_name!r} is neither a registered tool "
                         f"({', '.join(TOOL_REGISTRY.names())}) nor a 'package.module.Class' path")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"tool class_name {class_name!r}: cannot import module {module_name!r} ({e})") from e
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"tool class_name {class_name!r}: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise TypeError(f"tool class_name {class_name!r} must be a subclass of hybridflow.tools.base_tool.BaseTool")
    return cls


def tool_from_entry(entry: Any, where: str) -> BaseTool:
    """One ``tools:`` list item -> a tool object; errors name the entry and the missing/wrong field."""
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ValueError(f"{where}: each tool needs 'class_name' (and optionally 'config', 'tool_schema'), "
                         f"got {entry!r:.200}")
    unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a tool entry has class_name, config, tool_schema")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: 'config' must be a mapping, got {type(config).__name__}")
    tool_type = config.get("type", "native")
    if tool_type != "native":
        raise ValueError(f"{where}: config.type={tool_type!r} is not supported; only 'native' tools are built in "
                         "(MCP tools need the 'mcp' extra and an MCP tool class)")
    cls = resolve_tool_class(str(entry["class_name"]))
    try:
        return cls(config=config, tool_schema=entry.get("tool_schema"))
    except Exception as e:  # the schema or config is wrong: say which entry
        raise ValueError(f"{where} ({entry['class_name']}): {e}") from e


def initialize_tools_from_config(path: str | os.PathLike) -> list[BaseTool]:
    """Read a tool-config YAML and instantiate every tool in order (names must be unique)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tool config {path!r} does not exist (rollout.multi_turn.tool_config_path)")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ValueError(f"{path}: expected a top-level 'tools:' list of tool entries")
    tools = [tool_from_entry(entry, f"{path}: tools[{i}]") for i, entry in enumerate(data["tools"])]
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: tool names must be unique, duplicated: {duplicates}")
    return tools


__all__ = ["initialize_tools_from_config", "resolve_tool_class", "tool_from_entry", "VERL_TOOL_ALIASES"]
