"""Agent loops: the rollout floor between the trainer and the engines (verl's ``experimental.agent_loop``).

``AgentLoopManager.generate_sequences(prompts)`` is the trainer's one generation call: single-turn GRPO,
tool-using multi-turn trajectories and user-written loops all go through it.  ``__all__`` below is the one list
of the agent-loop API's public names: verl's paths ``hybridflow.experimental.agent_loop`` and
``hybridflow.experimental.agent_loop.agent_loop`` re-export exactly these.
"""

from hybridflow.agents.base import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    load_agent_loop_config,
    register,
    registered_agent_loops,
    resolve_agent_loop,
)
from hybridflow.agents.loop_manager import AgentLoopManager
from hybridflow.agents.single_turn import SingleTurnAgentLoop
from hybridflow.agents.tool_agent import ToolAgentLoop
from hybridflow.agents.loop_worker import AgentLoopWorker
from hybridflow.rollout.base import TokenOutput
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
    "TokenOutput",
    "ToolAgentLoop",
    "ToolListWrap",
    "load_agent_loop_config",
    "register",
    "registered_agent_loops",
    "resolve_agent_loop",
]
