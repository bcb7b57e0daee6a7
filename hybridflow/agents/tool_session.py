"""Tools, their executor and the interactions of a run: loaded once per agent-loop worker, shared by its
trajectories.

verl's loops re-read the tool YAML for every trajectory; here each config file is read once per process.
Sharing is safe: tools keep per-trajectory state in instances created per trajectory
(:class:`~hybridflow.tools.executor.ToolSession`), interactions in instances started per trajectory.
"""

from __future__ import annotations

import functools
import os

__all__ = ["load_tools", "load_tool_schemas", "load_executor", "load_interactions"]


def _absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


@functools.lru_cache(maxsize=None)
def _tools_from(path: str) -> tuple:
    from hybridflow.tools.utils.tool_registry import initialize_tools_from_config

    return tuple(initialize_tools_from_config(path))


def load_tools(path: str | None) -> dict:
    """``{tool name: tool}`` from a verl tool-config YAML (``{}`` without one)."""
    if not path:
        return {}
    return {tool.name: tool for tool in _tools_from(_absolute(path))}


def load_tool_schemas(path: str | None) -> list[dict]:
    """OpenAI function schemas of the tools in ``path``, as chat templates take them."""
    return [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in load_tools(path).values()]


@functools.lru_cache(maxsize=None)
def _executor(path: str | None, max_length: int, truncate_side: str):
    from hybridflow.tools.executor import ToolExecutor

    return ToolExecutor(load_tools(path), max_tool_response_length=max_length,
                        tool_response_truncate_side=truncate_side)


def load_executor(multi_turn_config):
    """The tool executor of ``rollout.multi_turn`` (its tools, observation length and truncation side)."""
    path = _absolute(multi_turn_config.tool_config_path) if multi_turn_config.tool_config_path else None
    return _executor(path, int(multi_turn_config.max_tool_response_length),
                     str(multi_turn_config.tool_response_truncate_side))


@functools.lru_cache(maxsize=None)
def _interactions_from(path: str) -> dict:
    from hybridflow.interactions.utils.interaction_registry import initialize_interactions_from_config

    return initialize_interactions_from_config(path)


def load_interactions(path: str | None) -> dict:
    """``{name: interaction}`` from ``rollout.multi_turn.interaction_config_path`` (``{}`` without one)."""
    return dict(_interactions_from(_absolute(path))) if path else {}
