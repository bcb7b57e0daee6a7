"""verl's ``verl.experimental.agent_loop.tool_agent_loop`` module path."""

from hybridflow.agents.tool_agent import ToolAgentLoop

__all__ = ["ToolAgentLoop"]
