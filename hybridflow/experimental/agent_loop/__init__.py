"""``from verl.experimental.agent_loop import ...`` works as ``from hybridflow.experimental.agent_loop import ...``.

The implementation lives in :mod:`hybridflow.agents`; these modules keep verl's public paths.
"""

from hybridflow.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopManager,
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    AsyncLLMServerManager,
    DictConfigWrap,
    ToolListWrap,
    register,
)
from hybridflow.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from hybridflow.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

__all__ = [
    "AgentLoopBase",
    "AgentLoopManager",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "AsyncLLMServerManager",
    "DictConfigWrap",
    "SingleTurnAgentLoop",
    "ToolAgentLoop",
    "ToolListWrap",
    "register",
]
