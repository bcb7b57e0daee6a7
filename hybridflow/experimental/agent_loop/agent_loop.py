"""verl's ``verl.experimental.agent_loop.agent_loop`` module path: the agent-loop API of :mod:`hybridflow.agents`
(its ``__all__`` is the one list of these names)."""

from hybridflow.agents import *  # noqa: F401,F403 - the agent-loop API's public names
from hybridflow.agents import __all__  # noqa: F401
