"""Tag-carrying formats whose values are written between tags: ``qwen3_coder``, ``glm``, ``seed``, ``minimax``.

* ``qwen3_coder`` (Qwen3-Coder, Qwen3.5): ``<tool_call><function=NAME><parameter=KEY>value</parameter>...
  </function></tool_call>``. Values are untyped text: with the run's tool schemas each becomes the type its
  parameter declares (integer, number, boolean, object/array, null), as verl converts them; a parameter the
  schema does not list stays a string. A block cut off before its closing tags is still read, as in verl.
* ``glm`` (GLM-4.5/4.6): ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>``;
  generation also stops at ``<|observation|>``.
* ``seed`` (ByteDance Seed-OSS): ``<seed:tool_call><function=NAME><parameter=KEY>VALUE</parameter>
  </function></seed:tool_call>``.
* ``minimax`` (MiniMax-M2): ``<minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter>
  </invoke>...</minimax:tool_call>`` (several invokes per block).

For ``glm``, ``seed`` and ``minimax`` a value that reads as JSON is that JSON value, else the text.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from hybridflow.agents.tool_parsers.base import (
    ParsedItem,
    ToolCallExtraction,
    ToolCallParseError,
    ToolParser,
    call_from_arguments,
    json_or_text,
    snippet,
    unterminated,
)


def tag_blocks(text: str, start: str, end: str) -> tuple[str, list[tuple[str, bool, str]]]:
    """(text before the first ``start``, [(body, closed, raw block) for every ``start ... end`` block])."""
    first = text.find(start)
    if first < 0:
        return text, []
    blocks = []
    pos = first
    while True:
        s = text.find(start, pos)
        if s < 0:
            break
        e = text.find(end, s + len(start))
        if e < 0:
            blocks.append((text[s + len(start):], False, text[s:]))
            break
        blocks.append((text[s + len(start):e], True, text[s:e + len(end)]))
        pos = e + len(end)
    return text[:first], blocks


# ------------------------------------------------------------------------------------------- qwen3_coder
_FUNCTION = re.compile(r"<function=(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|$)", re.DOTALL)
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def _declared_types(tools, name: str) -> dict[str, Any]:
    for tool in tools or ():
        if getattr(tool, "type", "function") == "function" and tool.function.name == name:
            return {k: v.type for k, v in tool.function.parameters.properties.items()}
    return {}


def _convert_one(value: str, kind: str) -> tuple[bool, Any]:
    kind = kind.strip().lower()
    if kind in _STRING_TYPES:
        return True, value
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return True, int(value)
        except ValueError:
            return False, value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return False, value
        return True, int(number) if number.is_integer() else number  # verl: 5.0 -> 5
    if kind in ("boolean", "bool", "binary"):
        if value.strip().lower() in ("true", "false"):
            return True, value.strip().lower() == "true"
        return False, value
    for read in (json.loads, ast.literal_eval):  # object, array and anything else structured
        try:
            return True, read(value)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return False, value


def convert_parameter(value: str, declared: Any) -> Any:
    """A qwen3_coder parameter text as the type its schema declares (``declared``: a type name, a list of
    them, or ``None`` for a parameter the schema does not list -- kept as text)."""
    if value.strip().lower() == "null":
        return None
    if declared is None:
        return value
    for kind in (declared if isinstance(declared, list) else [declared]):
        ok, converted = _convert_one(value, str(kind))
        if ok:
            return converted
    return value  # not of the declared type: the executor tells the model


@ToolParser.register("qwen3_coder")
class Qwen3XMLToolParser(ToolParser):
    start, end = "<tool_call>", "</tool_call>"

    def parse_function(self, body: str, tools) -> ParsedItem:
        header_end = body.find(">")
        if header_end < 0:
            return ToolCallParseError("missing_name", f"<function=NAME> is not closed with '>': {snippet(body)}", body)
        name = body[:header_end].strip()
        declared = _declared_types(tools, name)
        arguments: dict[str, Any] = {}
        for param in _PARAMETER.findall(body[header_end + 1:]):
            cut = param.find(">")
            if cut < 0:
                return ToolCallParseError("invalid_json", f"{name}: <parameter=NAME> is not closed with '>': "
                                          f"{snippet(param)}", body)
            value = param[cut + 1:]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            key = param[:cut].strip()
            arguments[key] = convert_parameter(value, declared.get(key))
        return call_from_arguments(name, arguments, body)

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        content, blocks = tag_blocks(text, self.start, self.end)
        items: list[ParsedItem] = []
        for body, _closed, raw in blocks:
            functions = _FUNCTION.findall(body)
            if not functions:
                items.append(ToolCallParseError("missing_name", f"the tool call has no <function=NAME>: "
                                                f"{snippet(raw)}", raw))
            items.extend(self.parse_function(f, tools) for f in functions)
        return ToolCallExtraction(content=content, items=items)


# ------------------------------------------------------------------------------------------- glm
_ARG_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_LEADING_THINK = re.compile(r"^\s*<think>.*?</think>|^\s*</think>", re.DOTALL)


@ToolParser.register("glm")
class GLMToolParser(ToolParser):
    start, end = "<tool_call>", "</tool_call>"

    @property
    def stop_token_ids(self) -> list[int]:
        return self._token_id("<|observation|>")

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        content, blocks = tag_blocks(text, self.start, self.end)
        items: list[ParsedItem] = []
        for body, closed, raw in blocks:
            if not closed:
                items.append(unterminated(self.start, self.end, raw))
                continue
            first = body.find("<arg_key>")
            name = body if first < 0 else body[:first]
            arguments = {} if first < 0 else {k.strip(): json_or_text(v) for k, v in _ARG_PAIR.findall(body[first:])}
            items.append(call_from_arguments(name, arguments, raw))
        return ToolCallExtraction(content=_LEADING_THINK.sub("", content, count=1) if blocks else content, items=items)


# ------------------------------------------------------------------------------------------- seed
_SEED_FUNCTION = re.compile(r"<function=([^>\n]+)>\s*(.*?)</function>", re.DOTALL)
_SEED_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@ToolParser.register("seed")
class SeedToolParser(ToolParser):
    start, end = "<seed:tool_call>", "</seed:tool_call>"

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        content, blocks = tag_blocks(text, self.start, self.end)
        items: list[ParsedItem] = []
        for body, closed, raw in blocks:
            match = _SEED_FUNCTION.search(body)
            if not closed:
                items.append(unterminated(self.start, self.end, raw))
            elif match is None:
                items.append(ToolCallParseError("missing_name", f"the tool call has no complete "
                                                f"<function=NAME>...</function>: {snippet(raw)}", raw))
            else:
                arguments = {k.strip(): json_or_text(v) for k, v in _SEED_PARAMETER.findall(match.group(2))}
                items.append(call_from_arguments(match.group(1), arguments, raw))
        return ToolCallExtraction(content=content, items=items)


# ------------------------------------------------------------------------------------------- minimax
_INVOKE = re.compile(r'<invoke name="([^"]*)">\s*(.*?)</invoke>', re.DOTALL)
_MINIMAX_PARAMETER = re.compile(r'<parameter name="([^"]+)">(.*?)</parameter>', re.DOTALL)


@ToolParser.register("minimax")
class MiniMaxToolParser(ToolParser):
    start, end = "<minimax:tool_call>", "</minimax:tool_call>"

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        content, blocks = tag_blocks(text, self.start, self.end)
        items: list[ParsedItem] = []
        for body, closed, raw in blocks:
            invokes = _INVOKE.findall(body)
            if not closed:
                items.append(unterminated(self.start, self.end, raw))
            elif not invokes:
                items.append(ToolCallParseError("missing_name", f"the tool call has no complete "
                                                f'<invoke name="NAME">...</invoke>: {snippet(raw)}', raw))
            for name, inner in invokes if closed else ():
                arguments = {k.strip(): json_or_text(v) for k, v in _MINIMAX_PARAMETER.findall(inner)}
                items.append(call_from_arguments(name, arguments, raw))
        return ToolCallExtraction(content=content, items=items)


__all__ = ["GLMToolParser", "MiniMaxToolParser", "Qwen3XMLToolParser", "SeedToolParser", "convert_parameter",
           "tag_blocks"]
