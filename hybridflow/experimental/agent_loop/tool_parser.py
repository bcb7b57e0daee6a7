"""verl's ``verl.experimental.agent_loop.tool_parser`` module path: the parser registry and every format."""

from hybridflow.agents.tool_parsers import *  # noqa: F401,F403 - the parsers' public names
from hybridflow.agents.tool_parsers import __all__  # noqa: F401
