"""Agent loops: the rollout floor between the trainer and the engines (verl's ``experimental.agent_loop``).

``AgentLoopManager.generate_sequences(prompts)`` is the trainer's one generation call: single-turn GRPO,
tool-using multi-turn trajectories and user-written loops all go through it.  verl users import the same
names from ``hybridflow.experimental.agent_loop``.
"""

from hybridflow.agents.base import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    load_agent_loop_config,
    register,
    registered_agent_loops,
    resolve_agent_loop,
)
from hybridflow.agents.loop_manager import AgentLoopManager
from hybridflow.agents.single_turn import SingleTurnAgentLoop
from hybridflow.agents.tool_agent import ToolAgentLoop
from hybridflow.agents.loop_worker import AgentLoopWorker
from hybridflow.rollout.service.server_manager import AsyncLLMServerManager

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
    "load_agent_loop_config",
    "register",
    "registered_agent_loops",
    "resolve_agent_loop",
]
