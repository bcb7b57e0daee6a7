"""verl's ``verl.experimental.agent_loop.agent_loop`` module path (see :mod:`hybridflow.agents`)."""

from hybridflow.agents.base import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    register,
)
from hybridflow.agents.loop_manager import AgentLoopManager
from hybridflow.agents.loop_worker import AgentLoopWorker
from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.server_manager import AsyncLLMServerManager

__all__ = [
    "AgentLoopBase",
    "AgentLoopManager",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "AsyncLLMServerManager",
    "DictConfigWrap",
    "TokenOutput",
    "ToolListWrap",
    "register",
]
