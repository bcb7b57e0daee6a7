"""``MCPBaseTool``: one tool of an MCP server, called through :mod:`hybridflow.tools.utils.mcp_client` (verl's class).

Declared in the tool YAML with ``config.type: mcp``; the loader asks the servers for their tools and makes one
tool object per server tool (schema from the server), e.g.::

    tools:
      - class_name: hybridflow.tools.mcp_base_tool.MCPBaseTool     # or verl.tools.mcp_search_tool.MCPSearchTool
        config: {type: mcp, timeout: 30, rate_limit: 10}
        mcp:
          mcp_servers_config_path: ./mcp_servers.json
          tool_selected_list: [add]                                # optional: only these tools

``timeout`` (s) bounds each call; ``rate_limit`` (calls/s, shared by the tools of one servers file) throttles
them. The observation is the text parts of the server's answer joined by spaces (subclasses override
:meth:`_parse_tool_result`); an answer the server flags as an error is shown with an ``Error:`` prefix.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hybridflow.tools.base_tool import BaseTool, ExecuteResult, parse_tool_config
from hybridflow.tools.schemas import ToolResponse


@dataclass
class MCPToolConfig:
    timeout: float = 30.0
    rate_limit: float | None = None


class MCPBaseTool(BaseTool):
    def __init__(self, config: dict | None = None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = parse_tool_config(MCPToolConfig, self.config, self.name)
        if not self.settings.timeout > 0:
            raise ValueError(f"tool '{self.name}': config.timeout={self.settings.timeout} must be > 0 seconds")
        self.client_manager = None  # set by the tool-config loader (tools/utils/tool_registry.py)

    def _parse_tool_result(self, content: list) -> tuple[str, dict]:
        """Observation text and metrics from the server's content blocks (text blocks only)."""
        texts = [part.text for part in content if getattr(part, "type", None) == "text"]
        return " ".join(texts), {}

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> ExecuteResult:
        if self.client_manager is None:
            raise RuntimeError(f"MCP tool '{self.name}' has no server connection; build it from a tool config with "
                               "config.type: mcp (initialize_tools_from_config)")
        try:
            result = await self.client_manager.call_tool(self.name, parameters, self.settings.timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"MCP tool '{self.name}' did not answer within {self.settings.timeout:g} s "
                               "(config.timeout)") from None
        text, metrics = self._parse_tool_result(list(result.content))
        is_error = bool(getattr(result, "is_error", getattr(result, "isError", False)))
        if is_error:
            return ToolResponse(text=f"Error: {text}"), 0.0, {**metrics, "error": 1.0}
        return ToolResponse(text=text), 0.0, metrics


__all__ = ["MCPBaseTool", "MCPToolConfig"]
