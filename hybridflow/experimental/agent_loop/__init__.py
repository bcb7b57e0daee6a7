"""``from verl.experimental.agent_loop import ...`` works as ``from hybridflow.experimental.agent_loop import ...``.

The implementation lives in :mod:`hybridflow.agents`, whose ``__all__`` is the one list of these names; the modules
of this package keep verl's public paths.
"""

from hybridflow.agents import *  # noqa: F401,F403 - the agent-loop API's public names
from hybridflow.agents import __all__  # noqa: F401
