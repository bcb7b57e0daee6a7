"""verl's ``verl.experimental.agent_loop.tool_parser`` module path: the parser registry and every format."""

from hybridflow.agents.tool_parser import (
    DeepSeekV4ToolParser,
    FunctionCall,
    GLMToolParser,
    Gemma4ToolParser,
    GptOssToolParser,
    HermesToolParser,
    KimiToolParser,
    MiniMaxToolParser,
    Qwen3XMLToolParser,
    SeedToolParser,
    ToolParser,
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
    "Qwen3XMLToolParser",
    "SeedToolParser",
    "ToolParser",
]
