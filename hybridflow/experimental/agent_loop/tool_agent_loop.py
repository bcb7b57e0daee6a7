"""verl's ``verl.experimental.agent_loop.tool_agent_loop`` module path."""

from hybridflow.agents.tool_agent import AgentState, ToolAgentLoop

__all__ = ["AgentState", "ToolAgentLoop"]
