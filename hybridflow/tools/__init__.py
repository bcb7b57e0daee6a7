"""Tools for agent loops (verl's tool API at verl's module paths) and their executor. The code sandbox they use
lives in :mod:`hybridflow.sandbox` (``run_python``, ``SandboxConfig`` and ``SandboxResult`` are re-exported here).

Importing this package registers the built-in tools: ``code_interpreter`` (``SandboxFusionTool``),
``calc_gsm8k_reward`` (``Gsm8kTool``), ``calculator``, ``search`` (``SearchTool``), ``image_zoom_in_tool``
(``ImageZoomInTool``, for vision-language models). MCP tools
(``mcp_base_tool.MCPBaseTool``, ``mcp_search_tool.MCPSearchTool``) need the ``mcp`` extra and are imported
on use. See docs/agents.md.
"""

from hybridflow.tools.base_tool import TOOL_REGISTRY, BaseTool, register_tool
from hybridflow.tools.calculator import CalculatorTool
from hybridflow.tools.executor import ToolCallOutcome, ToolExecutor, ToolSession, summarize_outcomes, truncate_tool_response
from hybridflow.tools import function_tool  # the module, callable as the decorator (see its _CallableModule)
from hybridflow.tools.function_tool import FunctionTool
from hybridflow.tools.gsm8k_tool import Gsm8kTool
from hybridflow.tools.image_zoom_in_tool import ImageZoomInTool
from hybridflow.sandbox import SandboxConfig, SandboxResult, run_python
from hybridflow.tools.sandbox_fusion_tools import CodeInterpreterTool, SandboxFusionTool
from hybridflow.tools.schemas import OpenAIFunctionCallSchema, OpenAIFunctionToolSchema, ToolResponse
from hybridflow.tools.search_tool import SearchTool
from hybridflow.tools.utils.tool_registry import initialize_tools_from_config

__all__ = [
    "BaseTool",
    "TOOL_REGISTRY",
    "register_tool",
    "function_tool",
    "FunctionTool",
    "initialize_tools_from_config",
    "ToolExecutor",
    "ToolSession",
    "ToolCallOutcome",
    "summarize_outcomes",
    "truncate_tool_response",
    "OpenAIFunctionToolSchema",
    "OpenAIFunctionCallSchema",
    "ToolResponse",
    "SandboxConfig",
    "SandboxResult",
    "run_python",
    "CalculatorTool",
    "CodeInterpreterTool",
    "SandboxFusionTool",
    "Gsm8kTool",
    "ImageZoomInTool",
    "SearchTool",
]
