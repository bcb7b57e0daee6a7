"""Tool calls parsed from generated token ids: the parser registry with every format registered.

The parsers live in :mod:`hybridflow.agents.tool_parsers` (one module per family of formats); this module
keeps the import path the agent loop and verl's ``experimental.agent_loop.tool_parser`` use.
"""

from hybridflow.agents.tool_parsers import (
    DeepSeekV4ToolParser,
    FunctionCall,
    GLMToolParser,
    Gemma4ToolParser,
    GptOssToolParser,
    HermesToolParser,
    KimiToolParser,
    MiniMaxToolParser,
    ParsedItem,
    Qwen3XMLToolParser,
    SeedToolParser,
    ToolCallExtraction,
    ToolCallParseError,
    ToolParser,
    make_call,
)

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
