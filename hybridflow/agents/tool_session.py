"""Tools and interactions of a run, loaded once per agent-loop worker and shared by its trajectories.

verl's loops re-read the tool YAML for every trajectory; here each config file is read once per process
(tool objects keep per-trajectory state in instances created per call, so sharing them is safe).
"""

from __future__ import annotations

import functools
import os

__all__ = ["load_tools", "load_tool_schemas"]


@functools.lru_cache(maxsize=None)
def _tools_from(path: str) -> tuple:
    from hybridflow.tools.utils.tool_registry import initialize_tools_from_config

    return tuple(initialize_tools_from_config(path))


def load_tools(path: str | None) -> dict:
    """``{tool name: tool}`` from a verl tool-config YAML (``{}`` without one)."""
    if not path:
        return {}
    return {tool.name: tool for tool in _tools_from(os.path.abspath(os.path.expanduser(path)))}


def load_tool_schemas(path: str | None) -> list[dict]:
    """OpenAI function schemas of the tools in ``path``, as chat templates take them."""
    return [tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for tool in load_tools(path).values()]
