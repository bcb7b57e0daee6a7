"""verl's module path for the tool base class: ``from verl.tools.base_tool import BaseTool`` keeps working
after replacing ``verl`` with ``hybridflow``. The implementation lives in :mod:`hybridflow.tools.base`."""

from hybridflow.tools.base import BaseTool
from hybridflow.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
