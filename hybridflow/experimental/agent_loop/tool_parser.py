"""verl's ``verl.experimental.agent_loop.tool_parser`` module path."""

from hybridflow.agents.tool_parser import FunctionCall, ToolParser

__all__ = ["FunctionCall", "ToolParser"]
