"""A user's tool file, written against verl's API with ``verl`` replaced by ``hybridflow``.

``rev`` reverses a word.  Every call is appended to the file named by the tool's ``log_path`` config key
(the process id and the argument), so a test can see that the call ran and in which process.
"""

import os
from typing import Any

from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.schemas import ToolResponse


class ReverseTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "rev",
            "description": "Reverse a word.",
            "parameters": {"type": "object", "properties": {"s": {"type": "string", "description": "the word"}},
                           "required": ["s"]},
        },
    }

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        word = str(parameters["s"])
        with open(self.config["log_path"], "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {word}\n")
        return ToolResponse(text=word[::-1]), 0.0, {}
