"""This floor's configuration rule, run by the launch's check pipeline (run stage): the agent-loop, tool and interaction
files load."""

from __future__ import annotations

from hybridflow.agents.setup_check import AgentConfigError, check_agent_config

__all__ = ["check_agent_files"]


def check_agent_files(cfg, errors: list[str]) -> None:
    """Agent-loop YAML, tool and interaction files, the tool-call format and the default agent loop (loaded, so
    every class they name is imported and built once here)."""
    try:
        check_agent_config(cfg)
    except AgentConfigError as e:
        errors.append(str(e))
