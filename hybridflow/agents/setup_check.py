"""Agent-loop configuration checked before any model loads: every file and name the run will need.

A wrong ``tool_config_path`` (or a tool class that does not import), a bad interaction file, an agent-loop
YAML whose ``_target_`` is missing, an unknown tool-call ``format`` or a ``default_agent_loop`` nobody
registered would otherwise surface after the workers started and the models loaded -- or, worse, inside
an agent-loop worker as a per-trajectory failure.  Here they stop the run at once with the key and the fix
(``hybridflow train`` exits 2).
"""

from __future__ import annotations

__all__ = ["AgentConfigError", "check_agent_config", "check_agent_names"]


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


def check_agent_names(dataset) -> None:
    """Every ``agent_name`` a dataset row names must be a registered agent loop (after :func:`check_agent_config`
    registered the configured ones); otherwise each of those rows would fail in every step.  Rows without one use
    ``rollout.agent.default_agent_loop``.  Datasets that do not keep their rows (a ``data.custom_cls``) are skipped."""
    from hybridflow.agents.base import registered_agent_loops

    rows = getattr(dataset, "rows", None)
    if rows is None:
        return
    known = set(registered_agent_loops())
    bad = [(i, row.get("agent_name")) for i, row in enumerate(rows)
           if row.get("agent_name") is not None and str(row.get("agent_name")) not in known]
    if not bad:
        return
    first, name = bad[0]
    where = dataset._where(first) if hasattr(dataset, "_where") else f"row {first}"
    names = sorted({str(n) for _, n in bad})
    raise AgentConfigError(
        f"{where}: column 'agent_name' is {name!r}, which is not a registered agent loop ({len(bad)} of {len(rows)} "
        f"rows name unregistered loops: {', '.join(map(repr, names[:5]))}). Registered: "
        f"{', '.join(sorted(known))}. Fix the column, or register the loop in "
        "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    )


def _check(load, key: str) -> None:
    try:
        load()
    except (OSError, ImportError, ValueError, TypeError, KeyError, AttributeError) as e:  # load_object's errors too
        raise AgentConfigError(f"{key}: {e}") from None
