"""Tools for agent loops (verl's tool API) and the local sandbox that runs model-written code.

Importing this package registers the built-in tools: ``code_interpreter``, ``calc_gsm8k_reward``,
``calculator``, ``search``.
"""

from hybridflow.tools.base_tool import TOOL_REGISTRY, BaseTool, register_tool, safe_execute
from hybridflow.tools.calculator import CalculatorTool
from hybridflow.tools.code_interpreter import CodeInterpreterTool
from hybridflow.tools.gsm8k_tool import Gsm8kTool
from hybridflow.tools.utils.tool_registry import initialize_tools_from_config
from hybridflow.tools.sandbox import SandboxConfig, SandboxResult, run_python
from hybridflow.tools.schemas import OpenAIFunctionCallSchema, OpenAIFunctionToolSchema, ToolResponse
from hybridflow.tools.search import SearchTool

__all__ = [
    "BaseTool",
    "TOOL_REGISTRY",
    "register_tool",
    "safe_execute",
    "initialize_tools_from_config",
    "OpenAIFunctionToolSchema",
    "OpenAIFunctionCallSchema",
    "ToolResponse",
    "SandboxConfig",
    "SandboxResult",
    "run_python",
    "CalculatorTool",
    "CodeInterpreterTool",
    "Gsm8kTool",
    "SearchTool",
]
