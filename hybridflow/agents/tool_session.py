"""Tools, their executor and the interactions of a run: loaded once per agent-loop worker, shared by its
trajectories.

verl's loops re-read the tool YAML for every trajectory; here each config file is read once per process.
Sharing is safe: tools keep per-trajectory state in instances created per trajectory
(:class:`~hybridflow.tools.executor.ToolSession`), interactions in instances started per trajectory.
"""

from __future__ import annotations

import functools
import os

__all__ = ["load_tools", "load_tool_schemas", "load_executor", "load_interactions", "tool_schemas"]


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


@functools.lru_cache(maxsize=None)
def _tools_from(path: str) -> tuple:
    from hybridflow.tools.utils.tool_registry import initialize_tools_from_config

    return tuple(initialize_tools_from_config(path))


def load_tools(path: str | None, function_tool_path: str | None = None) -> dict:
    """``{tool name: tool}`` from a verl tool-config YAML and a ``@function_tool`` file (``{}`` without
    either); a name on both sides is an error, as in verl's ``load_all_tools``."""
    tools = {tool.name: tool for tool in _tools_from(_absolute(path))} if path else {}
    if function_tool_path:
        from hybridflow.tools.utils.tool_registry import load_all_tools

        for tool in load_all_tools(None, _absolute(function_tool_path)):
            if tool.name in tools:
                raise ValueError(f"Function tool name(s) {[tool.name]} collide with tools already declared in "
                                 f"'{path}'. Each tool name must be unique across `tool_config_path` and "
                                 "`function_tool_path`; rename one of them.")
            tools[tool.name] = tool
    return tools


def tool_schemas(tools) -> list[dict]:
    """OpenAI function schemas of ``tools`` (tool objects), as chat templates take them."""
    return [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in tools]


def load_tool_schemas(path: str | None, function_tool_path: str | None = None) -> list[dict]:
    """OpenAI function schemas of the tools in ``path`` and ``function_tool_path``."""
    return tool_schemas(load_tools(path, function_tool_path).values())


@functools.lru_cache(maxsize=None)
def _executor(path: str | None, function_tool_path: str | None, max_length: int, truncate_side: str):
    from hybridflow.tools.executor import ToolExecutor

    return ToolExecutor(load_tools(path, function_tool_path), max_tool_response_length=max_length,
                        tool_response_truncate_side=truncate_side)


def load_executor(multi_turn_config, tools: list | None = None):
    """The tool executor of ``rollout.multi_turn`` (its tools -- ``tool_config_path`` and
    ``function_tool_path`` -- observation length and truncation side); ``tools`` given (verl's
    ``ToolAgentLoop(tools=ToolListWrap(...))``) replace the configured ones."""
    length = int(multi_turn_config.max_tool_response_length)
    side = str(multi_turn_config.tool_response_truncate_side)
    if tools is not None:
        from hybridflow.tools.executor import ToolExecutor

        return ToolExecutor(list(tools), max_tool_response_length=length, tool_response_truncate_side=side)
    path = _absolute(multi_turn_config.tool_config_path) if multi_turn_config.tool_config_path else None
    function_path = getattr(multi_turn_config, "function_tool_path", None)
    return _executor(path, _absolute(function_path) if function_path else None, length, side)


@functools.lru_cache(maxsize=None)
def _interactions_from(path: str) -> dict:
    from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config

    return initialize_interactions_from_config(path)


def load_interactions(path: str | None) -> dict:
    """``{name: interaction}`` from ``rollout.multi_turn.interaction_config_path`` (``{}`` without one)."""
    return dict(_interactions_from(_absolute(path))) if path else {}
