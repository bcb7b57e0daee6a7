"""The tool-call parser interface (verl's ``ToolParser`` registry, ``rollout.multi_turn.format``).

    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    content, calls = await parser.extract_tool_calls(response_ids, tools)       # verl's API: readable calls only
    found = await parser.extract_tool_calls_with_errors(response_ids, tools)    # + what could not be read
    for item in found.items:                                                    # calls and errors in text order
        ...  # FunctionCall -> ToolExecutor; ToolCallParseError -> executor.parse_error_outcome(item.message)

``tools`` (the run's ``OpenAIFunctionToolSchema`` list, optional) lets formats that write untyped values
(qwen3_coder) convert them to the schema's types, and Kimi's call ids resolve to tool names.
``stop_token_ids`` are extra tokens that end a model turn for formats whose models keep generating after a
call (Kimi, GLM, Gemma 4); the agent loop adds them to the sampling parameters.

Errors (:class:`ToolCallParseError`): ``invalid_json`` (arguments that cannot be read), ``missing_name``,
``unterminated`` (an opening tag with no end, e.g. the response hit its length limit). verl drops such calls
(or runs them with empty arguments); here the model reads what was wrong. ``FunctionCall.arguments`` is
always a JSON text (as verl); whether it fits the tool's schema is the executor's job.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

from pydantic import BaseModel

from hybridflow.utils.registry import Registry


class FunctionCall(BaseModel):
    """One call as the model wrote it: ``name``, ``arguments`` (JSON text) and the model's call id if any."""

    arguments: str
    name: str
    tool_call_id: Optional[str] = None


@dataclass
class ToolCallParseError:
    """A call the model tried to make but that cannot be read; ``message`` is written for the model."""

    kind: str
    message: str
    raw: str = ""


ParsedItem = Union[FunctionCall, ToolCallParseError]


@dataclass
class ToolCallExtraction:
    """``content``: the text without the call blocks; ``items``: calls and errors in the order written."""

    content: str
    items: list[ParsedItem] = field(default_factory=list)

    @property
    def calls(self) -> list[FunctionCall]:
        return [i for i in self.items if isinstance(i, FunctionCall)]

    @property
    def errors(self) -> list[ToolCallParseError]:
        return [i for i in self.items if isinstance(i, ToolCallParseError)]


def snippet(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def make_call(obj: object, raw: str, tool_call_id: str | None = None) -> ParsedItem:
    """A decoded ``{"name", "arguments"}`` object -> FunctionCall, or the error that explains what is wrong."""
    if not isinstance(obj, dict):
        return ToolCallParseError("invalid_json", f"a tool call must be a JSON object with \"name\" and "
                                  f"\"arguments\", got {type(obj).__name__}: {snippet(raw)}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallParseError("missing_name", f"the tool call has no \"name\" string: {snippet(raw)}", raw)
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            arguments = decoded
        else:  # keep the model's text: the executor answers "not valid JSON"/"must be an object"
            return FunctionCall(name=name.strip(), arguments=arguments, tool_call_id=tool_call_id)
    return FunctionCall(name=name.strip(), arguments=json.dumps(arguments, ensure_ascii=False), tool_call_id=tool_call_id)


def json_or_text(raw: str) -> Any:
    """A value written between tags: JSON when it reads as JSON (numbers, lists, objects...), else the text."""
    value = raw.strip()
    try:
        return json.loads(value)
    except ValueError:
        return value


def call_from_arguments(name: str, arguments: dict[str, Any], raw: str, tool_call_id: str | None = None) -> ParsedItem:
    if not name.strip():
        return ToolCallParseError("missing_name", f"the tool call has no function name: {snippet(raw)}", raw)
    return FunctionCall(name=name.strip(), arguments=json.dumps(arguments, ensure_ascii=False),
                        tool_call_id=tool_call_id)


def unterminated(start: str, end: str, raw: str) -> ToolCallParseError:
    return ToolCallParseError("unterminated", f"{start} was opened but never closed with {end}: {snippet(raw)}", raw)


def tool_names(tools) -> list[str]:
    return [t.function.name for t in tools or () if getattr(t, "type", "function") == "function"]


def strip_tokens(text: str, *tokens: str | None) -> str:
    for token in tokens:
        if token:
            text = text.replace(token, "")
    return text


TOOL_PARSERS: Registry[type["ToolParser"]] = Registry("tool-call format")


class ToolParser(ABC):
    """Base of the parsers; subclasses implement :meth:`parse_text` and register with :meth:`register`."""

    skip_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str):
        """Class decorator registering a format under ``name`` (a later registration replaces it)."""
        return TOOL_PARSERS.register(name, override=True)

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer) -> "ToolParser":
        if name not in TOOL_PARSERS:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format: {TOOL_PARSERS.unknown_message(name)}")
        return TOOL_PARSERS.get(name)(tokenizer)

    @classmethod
    def names(cls) -> list[str]:
        return TOOL_PARSERS.names()

    @property
    def stop_token_ids(self) -> list[int]:
        """Tokens that end a model turn besides EOS (none unless the format's models need one)."""
        return []

    def _token_id(self, token: str) -> list[int]:
        """``[id]`` of a special token the tokenizer knows, ``[]`` otherwise."""
        if self.tokenizer is None:
            return []
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        unk = getattr(self.tokenizer, "unk_token_id", None)
        return [token_id] if isinstance(token_id, int) and token_id >= 0 and token_id != unk else []

    def decode(self, response_ids: list[int]) -> str:
        return self.tokenizer.decode(response_ids, skip_special_tokens=self.skip_special_tokens)

    @abstractmethod
    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        """Calls and errors in already decoded text (synchronous; no tokenizer needed)."""

    async def extract_tool_calls_with_errors(self, response_ids: list[int], tools: list | None = None) -> ToolCallExtraction:
        text = await asyncio.get_running_loop().run_in_executor(None, self.decode, list(response_ids))
        return self.parse_text(text, tools)

    async def extract_tool_calls(self, response_ids: list[int], tools: list | None = None) -> tuple[str, list[FunctionCall]]:
        """verl's API: ``(content, calls)``; malformed calls are left out (see the ``_with_errors`` variant)."""
        found = await self.extract_tool_calls_with_errors(response_ids, tools)
        return found.content, found.calls

    def format_tool_responses(self, texts: list[str], names: list[str]) -> str | None:
        """Text to append after tool calls when the chat template cannot render tool messages; ``None`` means
        render ``{"role": "tool"}`` messages with the chat template (every format but gpt-oss)."""
        return None


__all__ = [
    "FunctionCall",
    "ParsedItem",
    "ToolCallExtraction",
    "ToolCallParseError",
    "ToolParser",
    "call_from_arguments",
    "json_or_text",
    "make_call",
    "snippet",
    "strip_tokens",
    "tool_names",
    "unterminated",
]
