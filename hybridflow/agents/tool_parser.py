"""Tool calls parsed from generated token ids (verl's ``ToolParser`` registry; ``rollout.multi_turn.format``).

    parser = ToolParser.get_tool_parser("hermes", tokenizer)
    content, calls = await parser.extract_tool_calls(response_ids)          # verl's API: well-formed calls only
    found = await parser.extract_tool_calls_with_errors(response_ids)       # + what could not be read
    for item in found.items:                                                # calls and errors in text order
        ...  # FunctionCall -> ToolExecutor; ToolCallParseError -> executor.parse_error_outcome(item.message)

Formats:

* ``hermes`` (Qwen2.5/Hermes chat templates): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number of them anywhere in the text. The JSON is read with a real JSON decoder from the opening tag, so
  braces, quotes or even ``</tool_call>`` inside argument strings are fine. ``"parameters"`` is accepted for
  ``"arguments"``, and arguments given as a JSON *string* holding an object are unwrapped.
* ``gpt-oss`` (OpenAI harmony): ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}<|call|>`` (the ``<|start|>assistant`` prefix may be in the prompt instead, and the
  ``to=`` recipient may stand before ``<|channel|>``). Chain-of-thought (``analysis`` channel) is removed
  first: calls written while thinking are not calls.

Errors (:class:`ToolCallParseError`): ``invalid_json`` (the block is not one JSON object), ``missing_name``
(no string ``name``), ``unterminated`` (an opening tag with no end, e.g. the response hit its length limit).
``FunctionCall.arguments`` is always a JSON text (as verl); whether it fits the tool's schema is the
executor's job.
"""

from __future__ import annotations

import asyncio
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Union

from pydantic import BaseModel

from hybridflow.utils.registry import Registry


class FunctionCall(BaseModel):
    """One call as the model wrote it: ``name`` and ``arguments`` (JSON text)."""

    arguments: str
    name: str


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


def _snippet(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def make_call(obj: object, raw: str) -> ParsedItem:
    """A decoded call object -> FunctionCall, or the error that explains what is wrong with it."""
    if not isinstance(obj, dict):
        return ToolCallParseError("invalid_json", f"a tool call must be a JSON object with \"name\" and "
                                  f"\"arguments\", got {type(obj).__name__}: {_snippet(raw)}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallParseError("missing_name", f"the tool call has no \"name\" string: {_snippet(raw)}", raw)
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters", {})
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            arguments = decoded
        else:  # keep the model's text: the executor answers "not valid JSON"/"must be an object"
            return FunctionCall(name=name.strip(), arguments=arguments)
    return FunctionCall(name=name.strip(), arguments=json.dumps(arguments, ensure_ascii=False))


# rollout.multi_turn.format -> parser class (hermes, gpt-oss, ...; user modules may add their own)
TOOL_PARSERS: Registry[type["ToolParser"]] = Registry("tool-call format")


class ToolParser(ABC):
    """Base of the parsers; subclasses implement :meth:`parse_text` and register with :meth:`register`."""

    skip_special_tokens: ClassVar[bool] = False

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str):
        """Class decorator: make a parser selectable as ``rollout.multi_turn.format=name``."""
        return TOOL_PARSERS.register(name, override=True)

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer) -> "ToolParser":
        if name not in TOOL_PARSERS:
            raise ValueError(f"actor_rollout_ref.rollout.multi_turn.format: {TOOL_PARSERS.unknown_message(name)}")
        return TOOL_PARSERS.get(name)(tokenizer)

    @classmethod
    def names(cls) -> list[str]:
        return TOOL_PARSERS.names()

    def decode(self, response_ids: list[int]) -> str:
        return self.tokenizer.decode(response_ids, skip_special_tokens=self.skip_special_tokens)

    @abstractmethod
    def parse_text(self, text: str) -> ToolCallExtraction:
        """Calls and errors in already decoded text (synchronous; no tokenizer needed)."""

    async def extract_tool_calls_with_errors(self, response_ids: list[int]) -> ToolCallExtraction:
        text = await asyncio.get_running_loop().run_in_executor(None, self.decode, list(response_ids))
        return self.parse_text(text)

    async def extract_tool_calls(self, response_ids: list[int]) -> tuple[str, list[FunctionCall]]:
        """verl's API: ``(content, calls)``; malformed calls are left out (see the ``_with_errors`` variant)."""
        found = await self.extract_tool_calls_with_errors(response_ids)
        return found.content, found.calls

    def format_tool_responses(self, texts: list[str], names: list[str]) -> str | None:
        """Text to append after tool calls when the chat template cannot render tool messages; ``None`` means
        render ``{"role": "tool"}`` messages with the chat template (every format but gpt-oss)."""
        return None


_WS = re.compile(r"\s*")


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def parse_text(self, text: str) -> ToolCallExtraction:
        decoder = json.JSONDecoder()
        content: list[str] = []
        items: list[ParsedItem] = []
        pos = 0
        while True:
            start = text.find(self.start_tag, pos)
            if start < 0:
                content.append(text[pos:])
                break
            content.append(text[pos:start])
            body = _WS.match(text, start + len(self.start_tag)).end()
            try:
                obj, json_end = decoder.raw_decode(text, body)
            except json.JSONDecodeError:
                obj, json_end = None, -1
            if json_end >= 0:
                after = _WS.match(text, json_end).end()
                if text.startswith(self.end_tag, after):
                    items.append(make_call(obj, text[body:json_end]))
                    pos = after + len(self.end_tag)
                    continue
            end = text.find(self.end_tag, start + len(self.start_tag))
            if end < 0:
                raw = text[start:]
                items.append(ToolCallParseError(
                    "unterminated", f"{self.start_tag} was opened but never closed with {self.end_tag}: "
                    f"{_snippet(raw)}", raw))
                content.append(raw)
                break
            raw = text[start + len(self.start_tag):end]
            why = "extra text after the JSON object" if json_end >= 0 else "not valid JSON"
            items.append(ToolCallParseError("invalid_json", f"the tool call is {why}; write "
                                            f'{self.start_tag}{{"name": ..., "arguments": {{...}}}}{self.end_tag}: '
                                            f"{_snippet(raw.strip())}", raw))
            pos = end + len(self.end_tag)
        return ToolCallExtraction(content="".join(content), items=items)


_NO_TAG = r"(?:(?!<\|).)*?"
_HARMONY_MESSAGE = re.compile(
    r"(?:<\|start\|>assistant(?P<header>" + _NO_TAG + r"))?<\|channel\|>(?P<channel>" + _NO_TAG + r")"
    r"(?:<\|constrain\|>(?P<constrain>" + _NO_TAG + r"))?<\|message\|>(?P<body>.*?)"
    r"(?P<end><\|call\|>|<\|end\|>|<\|return\|>|(?=<\|start\|>)|$)",
    re.DOTALL,
)
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


@ToolParser.register("gpt-oss")
class GptOssToolParser(ToolParser):
    """OpenAI harmony format; decodes with special tokens (they delimit the messages)."""

    skip_special_tokens = False

    def parse_text(self, text: str) -> ToolCallExtraction:
        pad = getattr(self.tokenizer, "pad_token", None) if self.tokenizer is not None else None
        if pad:
            text = text.replace(pad, "")
        content: list[str] = []
        items: list[ParsedItem] = []
        pos = 0
        for match in _HARMONY_MESSAGE.finditer(text):
            content.append(text[pos:match.start()])
            pos = match.end()
            channel = match.group("channel").strip()
            recipient = _RECIPIENT.search(match.group("header") or "") or _RECIPIENT.search(channel)
            if channel.split(" ")[0] == "analysis":
                continue  # chain of thought: never a call, not content
            if recipient is None:
                content.append(match.group(0))
                continue
            name, body = recipient.group(1), match.group("body")
            if not match.group("end"):
                items.append(ToolCallParseError("unterminated", f"the call to functions.{name} has no <|call|>: "
                                                f"{_snippet(body)}", body))
                continue
            try:
                arguments = json.loads(body) if body.strip() else {}
            except json.JSONDecodeError as e:
                items.append(ToolCallParseError("invalid_json", f"the arguments of functions.{name} are not valid "
                                                f"JSON ({e.msg}): {_snippet(body)}", body))
                continue
            items.append(make_call({"name": name, "arguments": arguments}, body))
        content.append(text[pos:])
        return ToolCallExtraction(content="".join(content), items=items)

    def format_tool_responses(self, texts: list[str], names: list[str]) -> str:
        """Harmony tool messages (one per call) followed by the next assistant header, as verl writes them."""
        if len(texts) != len(names):
            raise ValueError(f"{len(texts)} tool responses for {len(names)} calls")
        parts = [f"<|start|>functions.{name} to=assistant<|channel|>commentary<|message|>{text}<|end|>"
                 for text, name in zip(texts, names)]
        return "".join(parts) + "<|start|>assistant"


__all__ = [
    "FunctionCall",
    "TOOL_PARSERS",
    "GptOssToolParser",
    "HermesToolParser",
    "ToolCallExtraction",
    "ToolCallParseError",
    "ToolParser",
    "make_call",
]
