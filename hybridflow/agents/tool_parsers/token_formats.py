"""Formats delimited by special tokens: ``kimi`` (Kimi K2), ``deepseek_v4`` (DSML) and ``gemma4``.

* ``kimi``: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
  {json}<|tool_call_end|>...<|tool_calls_section_end|>``. The call id (``functions.NAME:0``) is kept as
  ``tool_call_id``; the tool name is NAME, or -- for ids in another shape -- the one tool whose name the id
  contains, or the one tool whose required parameters the arguments supply (verl's rules). Generation also
  stops at ``<|im_end|>``.
* ``deepseek_v4``: ``<｜DSML｜tool_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="KEY"
  string="true|false">VALUE</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>``; ``string="true"``
  values are text, others JSON. The content drops the reasoning (everything up to ``</think>``).
* ``gemma4``: ``<|tool_call>call:NAME{key:<|"|>text<|"|>,n:5,flag:true,obj:{a:1},xs:[1,2]}<tool_call|>``;
  values are ``<|"|>``-quoted text, nested ``{...}`` / ``[...]``, or bare true/false/null/numbers/words.
  Generation also stops at ``<tool_call|>`` (Gemma 4 does not emit EOS after a call).
"""

from __future__ import annotations

import json
import re
from typing import Any

from hybridflow.agents.tool_parsers.base import (
    ParsedItem,
    ToolCallExtraction,
    ToolCallParseError,
    ToolParser,
    call_from_arguments,
    snippet,
    strip_tokens,
    tool_names,
    unterminated,
)


# ------------------------------------------------------------------------------------------- kimi
_KIMI_ID = re.compile(r"^(?:functions\.)?(.+?)(?::\d+)?$")


def kimi_tool_name(call_id: str, arguments: dict, tools) -> str:
    """The tool a Kimi call id names (see the module doc)."""
    names = tool_names(tools)
    canonical = _KIMI_ID.match(call_id)
    if canonical and (not names or canonical.group(1) in names):
        return canonical.group(1)
    if not names:
        return call_id
    compact = call_id.lower().replace("-", "_")
    contained = [n for n in names if n.lower() in compact]
    if len(contained) == 1:
        return contained[0]
    fitting = [t.function.name for t in tools if getattr(t, "type", "function") == "function"
               and t.function.parameters.required and set(t.function.parameters.required) <= set(arguments)]
    return fitting[0] if len(fitting) == 1 else call_id


@ToolParser.register("kimi")
class KimiToolParser(ToolParser):
    section = "<|tool_calls_section_begin|>"
    begin, argument, end = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

    @property
    def stop_token_ids(self) -> list[int]:
        return self._token_id("<|im_end|>")

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        start = text.find(self.section)
        if start < 0:
            return ToolCallExtraction(content=text)
        items: list[ParsedItem] = []
        pos = start
        while (b := text.find(self.begin, pos)) >= 0:
            e = text.find(self.end, b)
            if e < 0:
                items.append(unterminated(self.begin, self.end, text[b:]))
                break
            raw = text[b:e + len(self.end)]
            head, sep, body = text[b + len(self.begin):e].partition(self.argument)
            call_id = head.strip()
            try:
                arguments = json.loads(body) if sep else None
            except ValueError as err:
                items.append(ToolCallParseError("invalid_json", f"the arguments of {call_id} are not valid JSON "
                                                f"({err}): {snippet(body)}", raw))
            else:
                if not isinstance(arguments, dict):
                    items.append(ToolCallParseError("invalid_json", f"the arguments of {call_id} must be a JSON "
                                                    f"object after {self.argument}: {snippet(raw)}", raw))
                else:
                    items.append(call_from_arguments(kimi_tool_name(call_id, arguments, tools), arguments, raw,
                                                     tool_call_id=call_id))
            pos = e + len(self.end)
        return ToolCallExtraction(content=text[:start], items=items)


# ------------------------------------------------------------------------------------------- deepseek_v4
_DSML = re.escape("｜DSML｜")
_DSML_INVOKE = re.compile(rf'<{_DSML}invoke name="(.*?)">(.*?)</{_DSML}invoke>', re.DOTALL)
_DSML_PARAMETER = re.compile(rf'<{_DSML}parameter name="(.*?)" string="(true|false)">(.*?)</{_DSML}parameter>',
                             re.DOTALL)


@ToolParser.register("deepseek_v4")
class DeepSeekV4ToolParser(ToolParser):
    start, end = "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"
    eos = "<｜end▁of▁sentence｜>"

    @staticmethod
    def _answer(text: str) -> str:
        return text.rpartition("</think>")[2]

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        text = strip_tokens(text, getattr(self.tokenizer, "pad_token", None), self.eos)
        first = text.find(self.start)
        if first < 0:
            return ToolCallExtraction(content=self._answer(text))
        items: list[ParsedItem] = []
        pos = first
        while (s := text.find(self.start, pos)) >= 0:
            e = text.find(self.end, s)
            if e < 0:
                items.append(unterminated(self.start, self.end, text[s:]))
                break
            raw = text[s:e + len(self.end)]
            for name, body in _DSML_INVOKE.findall(raw):
                arguments: dict[str, Any] = {}
                for key, is_text, value in _DSML_PARAMETER.findall(body):
                    if is_text == "true":
                        arguments[key] = value
                    else:
                        try:
                            arguments[key] = json.loads(value)
                        except ValueError:
                            arguments[key] = value  # verl keeps the raw text; the schema check decides
                items.append(call_from_arguments(name, arguments, raw))
            pos = e + len(self.end)
        return ToolCallExtraction(content=self._answer(text[:first]).removesuffix("\n\n"), items=items)


# ------------------------------------------------------------------------------------------- gemma4
_QUOTE = '<|"|>'


class _GemmaArgs:
    """A small recursive reader of Gemma 4's argument syntax (``{key:value,...}``)."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def fail(self, what: str):
        raise ValueError(f"{what} at character {self.pos}")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def value(self) -> Any:
        self.skip()
        if self.text.startswith(_QUOTE, self.pos):
            end = self.text.find(_QUOTE, self.pos + len(_QUOTE))
            if end < 0:
                self.fail("unclosed <|\"|> string")
            out = self.text[self.pos + len(_QUOTE):end]
            self.pos = end + len(_QUOTE)
            return out
        if self.text.startswith("{", self.pos):
            return self.obj()
        if self.text.startswith("[", self.pos):
            return self.array()
        match = re.compile(r"[^,}\]]*").match(self.text, self.pos)
        self.pos = match.end()
        return self.bare(match.group(0).strip())

    @staticmethod
    def bare(token: str) -> Any:
        low = token.lower()
        if low in ("true", "false"):
            return low == "true"
        if low == "null":
            return None
        for cast in (int, float):
            try:
                return cast(token)
            except ValueError:
                pass
        return token

    def obj(self) -> dict[str, Any]:
        self.pos += 1  # '{'
        out: dict[str, Any] = {}
        while True:
            self.skip()
            if self.text.startswith("}", self.pos):
                self.pos += 1
                return out
            key = re.compile(r"\s*([^:{},\[\]]+?)\s*:").match(self.text, self.pos)
            if key is None:
                self.fail("expected 'key:'")
            self.pos = key.end()
            out[key.group(1)] = self.value()
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif not self.text.startswith("}", self.pos):
                self.fail("expected ',' or '}'")

    def array(self) -> list[Any]:
        self.pos += 1  # '['
        out: list[Any] = []
        while True:
            self.skip()
            if self.text.startswith("]", self.pos):
                self.pos += 1
                return out
            out.append(self.value())
            self.skip()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif not self.text.startswith("]", self.pos):
                self.fail("expected ',' or ']'")


@ToolParser.register("gemma4")
class Gemma4ToolParser(ToolParser):
    start, end = "<|tool_call>", "<tool_call|>"
    _header = re.compile(r"call:([\w.\-]+)\s*")

    @property
    def stop_token_ids(self) -> list[int]:
        return self._token_id(self.end)

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
        text = strip_tokens(text, getattr(self.tokenizer, "pad_token", None))
        first = text.find(self.start)
        if first < 0:
            return ToolCallExtraction(content=text)
        items: list[ParsedItem] = []
        pos = first
        while (s := text.find(self.start, pos)) >= 0:
            body_start = s + len(self.start)
            header = self._header.match(text, body_start)
            if header is None or not text.startswith("{", header.end()):
                e = text.find(self.end, body_start)
                raw = text[s:] if e < 0 else text[s:e + len(self.end)]
                items.append(ToolCallParseError("missing_name", f"expected call:NAME{{...}} after {self.start}: "
                                                f"{snippet(raw)}", raw))
                if e < 0:
                    break
                pos = e + len(self.end)
                continue
            reader = _GemmaArgs(text)
            reader.pos = header.end()
            try:
                arguments = reader.obj()
            except (ValueError, IndexError) as err:
                e = text.find(self.end, body_start)
                raw = text[s:] if e < 0 else text[s:e + len(self.end)]
                kind = "unterminated" if e < 0 else "invalid_json"
                items.append(ToolCallParseError(kind, f"the arguments of {header.group(1)} cannot be read ({err}): "
                                                f"{snippet(raw)}", raw))
                if e < 0:
                    break
                pos = e + len(self.end)
                continue
            reader.skip()
            if not text.startswith(self.end, reader.pos):
                raw = text[s:reader.pos]
                items.append(unterminated(self.start, self.end, raw))
                pos = reader.pos
                continue
            items.append(call_from_arguments(header.group(1), arguments, text[s:reader.pos + len(self.end)]))
            pos = reader.pos + len(self.end)
        return ToolCallExtraction(content=text[:first], items=items)


__all__ = ["DeepSeekV4ToolParser", "Gemma4ToolParser", "KimiToolParser", "kimi_tool_name"]
