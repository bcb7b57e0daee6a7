"""Build tool objects from verl's tool-config YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``).

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool      # a class path, or a registered name: calc_gsm8k_reward
        config: {type: native}
        tool_schema: {type: function, function: {name: calc_gsm8k_reward, description: ..., parameters: ...}}
      - class_name: verl.tools.mcp_base_tool.MCPBaseTool # type: mcp -> one tool per tool of the MCP servers
        config: {type: mcp, timeout: 30}
        mcp: {mcp_servers_config_path: ./mcp_servers.json, tool_selected_list: [add]}

verl users keep their files: a class path starting with ``verl.`` is read with ``hybridflow.`` in its place
(the built-in tools live at verl's module paths), and any other dotted path is imported, so custom tools
written against :class:`hybridflow.tools.base_tool.BaseTool` (or made with ``@function_tool``) work as in
verl. ``tool_schema`` may be omitted when the class provides one.  A user's tool module kept beside the YAML is
found in every process that reads the YAML (Ray agent-loop workers included): the YAML's folder is put on the
import path, as for agent-loop YAMLs (``rollout.agent.agent_loop_config_path``).

:func:`load_all_tools` is verl's loader of a run's tools: this YAML's tools plus the ``@function_tool``
functions of ``rollout.multi_turn.function_tool_path`` (verl's current path for it is
``verl.tools.tool_registry``, i.e. :mod:`hybridflow.tools.tool_registry`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import yaml

from hybridflow.tools.base_tool import TOOL_REGISTRY, BaseTool
from hybridflow.tools.function_tool import (
    FunctionTool,
    adapter_class,
    load_function_tools_from_path,
    registered_function_tool,
)
from hybridflow.utils.load_object import load_object

_ENTRY_KEYS = {"class_name", "config", "tool_schema", "mcp"}
_MCP_KEYS = {"mcp_servers_config_path", "tool_selected_list"}


def get_tool_class(cls_name: str) -> Any:
    """verl's loader: the object at ``package.module.Name`` (``verl.`` read as ``hybridflow.``); a missing
    module raises ``ModuleNotFoundError``, a missing name ``AttributeError`` (as in verl)."""
    return load_object(cls_name, key="tool class_name", kind="tool class")


def resolve_tool_class(class_name: str, base_dir: str | None = None) -> type[BaseTool]:
    """A registered name, a verl built-in class path, an importable ``module.Class`` / ``file.py:Class``, or the
    path of a function decorated with ``@function_tool`` (wrapped in a ``BaseTool``)."""
    from hybridflow.utils.load_object import load_object

    if class_name in TOOL_REGISTRY:
        return TOOL_REGISTRY.get(class_name)
    if "." not in class_name and ":" not in class_name:
        raise ValueError(f"tool class_name {class_name!r} is neither a registered tool "
                         f"({', '.join(TOOL_REGISTRY.names())}) nor a 'package.module.Class' path")
    obj = load_object(class_name, key="tool class_name", kind="tool class", base_dir=base_dir)
    function = registered_function_tool(obj)
    if function is not None:
        return adapter_class(function)
    problem = _tool_class(obj)
    if problem:
        raise TypeError(f"tool class_name {class_name!r} {problem}")
    return obj


def _tool_class(obj: Any) -> str | None:
    if isinstance(obj, type) and issubclass(obj, BaseTool):
        return None
    return ("must be a subclass of hybridflow.tools.base_tool.BaseTool (or a function decorated with "
            "@hybridflow.tools.function_tool)")


def _check_entry(entry: Any, where: str) -> dict:
    if not isinstance(entry, dict) or "class_name" not in entry:
        raise ValueError(f"{where}: each tool needs 'class_name' (and optionally 'config', 'tool_schema'), "
                         f"got {entry!r:.200}")
    unknown = sorted(set(entry) - _ENTRY_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; a tool entry has class_name, config, tool_schema "
                         "(and mcp for type: mcp)")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}: 'config' must be a mapping, got {type(config).__name__}")
    return config


def _mcp_tools(entry: dict, config: dict, where: str, base_dir: str) -> list[BaseTool]:
    from hybridflow.tools.utils.mcp_client import get_client_manager, require_mcp

    try:
        require_mcp()
    except ImportError as e:
        raise ImportError(f"{where}: config.type=mcp: {e}") from e
    from hybridflow.tools.base_tool import parse_tool_config
    from hybridflow.tools.mcp_base_tool import MCPBaseTool, MCPToolConfig

    mcp = entry.get("mcp")
    if not isinstance(mcp, dict) or not mcp.get("mcp_servers_config_path"):
        raise ValueError(f"{where}: config.type=mcp needs 'mcp: {{mcp_servers_config_path: <servers json>, "
                         "tool_selected_list: [optional names]}}'")
    unknown = sorted(set(mcp) - _MCP_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} under 'mcp'; known: {sorted(_MCP_KEYS)}")
    if entry.get("tool_schema") is not None:
        raise ValueError(f"{where}: an MCP tool's schema comes from its server; remove 'tool_schema'")
    cls = resolve_tool_class(str(entry["class_name"]), base_dir)
    if not issubclass(cls, MCPBaseTool):
        raise TypeError(f"{where}: config.type=mcp needs an MCPBaseTool subclass, got {entry['class_name']}")
    path = str(mcp["mcp_servers_config_path"])
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(base_dir, path)  # relative to the tool config file as a fallback
    selected = mcp.get("tool_selected_list")
    if selected is not None and not (isinstance(selected, list) and all(isinstance(s, str) for s in selected)):
        raise ValueError(f"{where}: mcp.tool_selected_list must be a list of tool names")
    settings = parse_tool_config(MCPToolConfig, config, str(entry["class_name"]))
    manager = get_client_manager(path, rate_limit=settings.rate_limit)
    tools = []
    for schema in manager.list_tools(selected):
        try:
            tool = cls(config=config, tool_schema=schema)
        except Exception as e:
            raise ValueError(f"{where} ({entry['class_name']}, MCP tool {schema['function']['name']!r}): {e}") from e
        tool.client_manager = manager
        tools.append(tool)
    return tools


def tools_from_entry(entry: Any, where: str, base_dir: str = ".") -> list[BaseTool]:
    """One ``tools:`` list item -> its tool objects (one, or one per MCP server tool)."""
    config = _check_entry(entry, where)
    tool_type = config.get("type", "native")
    if tool_type == "mcp":
        return _mcp_tools(entry, config, where, base_dir)
    if tool_type != "native":
        raise ValueError(f"{where}: config.type={tool_type!r} must be 'native' or 'mcp'")
    if entry.get("mcp") is not None:
        raise ValueError(f"{where}: an 'mcp:' section needs config.type: mcp")
    cls = resolve_tool_class(str(entry["class_name"]), base_dir)
    try:
        return [cls(config=config, tool_schema=entry.get("tool_schema"))]
    except Exception as e:  # the schema or config is wrong: say which entry
        raise ValueError(f"{where} ({entry['class_name']}): {e}") from e


def initialize_tools_from_config(tools_config_file: str | os.PathLike) -> list[BaseTool]:
    """Read a tool-config YAML and instantiate every tool in order (names must be unique)."""
    path = os.fspath(tools_config_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tool config {path!r} does not exist (rollout.multi_turn.tool_config_path)")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise ValueError(f"{path}: expected a top-level 'tools:' list of tool entries")
    base_dir = os.path.dirname(os.path.abspath(path))
    if base_dir not in sys.path:
        sys.path.append(base_dir)
    tools = [t for i, entry in enumerate(data["tools"]) for t in tools_from_entry(entry, f"{path}: tools[{i}]", base_dir)]
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{path}: tool names must be unique, duplicated: {duplicates}")
    return tools


def load_all_tools(tool_config_path: str | os.PathLike | None,
                   function_tool_path: str | os.PathLike | None) -> list[BaseTool | FunctionTool]:
    """verl's loader of one run's tools: the tool YAML's tools (native and MCP) followed by the
    ``@function_tool`` functions of ``function_tool_path`` (registered ``FunctionTool`` objects, the same ones
    on every call). A name used on both sides is an error listing every clash."""
    native = initialize_tools_from_config(tool_config_path) if tool_config_path else []
    functions = load_function_tools_from_path(function_tool_path) if function_tool_path else []
    if native and functions:
        taken = {t.name for t in native}
        clashes = sorted(t.name for t in functions if t.name in taken)
        if clashes:
            raise ValueError(f"Function tool name(s) {clashes} collide with tools already declared in "
                             f"'{tool_config_path}'. Each tool name must be unique across `tool_config_path` and "
                             "`function_tool_path`; rename one of them.")
    return native + functions


__all__ = ["get_tool_class", "initialize_tools_from_config", "load_all_tools", "resolve_tool_class",
           "tools_from_entry"]
