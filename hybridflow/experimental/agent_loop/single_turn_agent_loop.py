"""verl's ``verl.experimental.agent_loop.single_turn_agent_loop`` module path."""

from hybridflow.agents.single_turn import SingleTurnAgentLoop

__all__ = ["SingleTurnAgentLoop"]
