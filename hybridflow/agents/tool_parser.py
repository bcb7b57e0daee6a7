"""Tool calls parsed from generated token ids: the parser registry with every format registered.

The parsers live in :mod:`hybridflow.agents.tool_parsers` (one module per family of formats); this module
keeps the import path the agent loop and verl's ``experimental.agent_loop.tool_parser`` use.
"""

from hybridflow.agents.tool_parsers import *  # noqa: F401,F403 - the package's public names
from hybridflow.agents.tool_parsers import __all__  # noqa: F401
