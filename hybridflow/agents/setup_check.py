"""Agent-loop configuration checked before any model loads: every file and name the run will need.

A wrong ``tool_config_path`` (or a tool class that does not import), a bad interaction file, an agent-loop
YAML whose ``_target_`` is missing, an unknown tool-call ``format`` or a ``default_agent_loop`` nobody
registered would otherwise surface after the workers started and the models loaded -- or, worse, inside
an agent-loop worker as a per-trajectory failure.  Here they stop the run at once with the key and the fix
(``hybridflow train`` exits 2).
"""

from __future__ import annotations

__all__ = ["AgentConfigError", "check_agent_config"]


class AgentConfigError(ValueError):
    """The agent-loop configuration cannot work; the message names the key and the fix."""


def check_agent_config(config) -> None:
    """Load (and so validate) what ``actor_rollout_ref.rollout.{agent,multi_turn}`` and
    ``data.tool_config_path`` name; raise :class:`AgentConfigError` on the first problem."""
    from hybridflow.agents.base import load_agent_loop_config, registered_agent_loops
    from hybridflow.agents.loop_worker import default_agent_loop, register_builtin_loops
    from hybridflow.agents.tool_parser import ToolParser
    from hybridflow.agents.tool_session import load_interactions, load_tools

    rollout = config.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout"
    register_builtin_loops()
    _check(lambda: load_agent_loop_config(rollout.agent.agent_loop_config_path)
           if rollout.agent.agent_loop_config_path else None, f"{key}.agent.agent_loop_config_path")
    default = default_agent_loop(rollout)
    if default not in registered_agent_loops():
        raise AgentConfigError(f"{key}.agent.default_agent_loop={rollout.agent.default_agent_loop!r} is not a "
                               f"registered agent loop (known: {', '.join(registered_agent_loops())}); list it in "
                               f"{key}.agent.agent_loop_config_path or pick a known one")
    mt = rollout.multi_turn
    _check(lambda: load_tools(mt.tool_config_path), f"{key}.multi_turn.tool_config_path")
    _check(lambda: load_tools(config.data.tool_config_path), "data.tool_config_path")
    _check(lambda: load_interactions(mt.interaction_config_path), f"{key}.multi_turn.interaction_config_path")
    if mt.format not in ToolParser.names():
        raise AgentConfigError(f"{key}.multi_turn.format={mt.format!r} is not a tool-call format; choose one of: "
                               f"{', '.join(ToolParser.names())}")


def _check(load, key: str) -> None:
    try:
        load()
    except (OSError, ImportError, ValueError, TypeError, KeyError, AttributeError) as e:  # load_object's errors too
        raise AgentConfigError(f"{key}: {e}") from None
