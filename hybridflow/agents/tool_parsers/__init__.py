"""Tool-call parsers, one per model family (verl's ``rollout.multi_turn.format`` names).

Importing the package registers every format: ``hermes`` and ``gpt-oss`` (:mod:`.json_formats`),
``qwen3_coder``, ``glm``, ``seed``, ``minimax`` (:mod:`.xml_formats`), ``kimi``, ``deepseek_v4``, ``gemma4``
(:mod:`.token_formats`); the interface is in :mod:`.base`.
"""

from hybridflow.agents.tool_parsers.base import (
    FunctionCall,
    ParsedItem,
    ToolCallExtraction,
    ToolCallParseError,
    ToolParser,
    make_call,
)
from hybridflow.agents.tool_parsers.json_formats import GptOssToolParser, HermesToolParser
from hybridflow.agents.tool_parsers.token_formats import DeepSeekV4ToolParser, Gemma4ToolParser, KimiToolParser
from hybridflow.agents.tool_parsers.xml_formats import GLMToolParser, MiniMaxToolParser, Qwen3XMLToolParser, SeedToolParser

__all__ = [
    "DeepSeekV4ToolParser",
    "FunctionCall",
    "GLMToolParser",
    "Gemma4ToolParser",
    "GptOssToolParser",
    "HermesToolParser",
    "KimiToolParser",
    "MiniMaxToolParser",
    "ParsedItem",
    "Qwen3XMLToolParser",
    "SeedToolParser",
    "ToolCallExtraction",
    "ToolCallParseError",
    "ToolParser",
    "make_call",
]
