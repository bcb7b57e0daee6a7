"""verl's ``verl.tools.tool_registry`` module path (since May 2026; before, ``verl.tools.utils.tool_registry``).

The implementation lives in :mod:`hybridflow.tools.utils.tool_registry`; both paths give the same functions.
"""

from hybridflow.tools.utils.tool_registry import (
    get_tool_class,
    initialize_tools_from_config,
    load_all_tools,
    resolve_tool_class,
)

__all__ = ["get_tool_class", "initialize_tools_from_config", "load_all_tools", "resolve_tool_class"]
