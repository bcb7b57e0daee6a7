"""JSON-carrying formats: ``hermes`` and ``gpt-oss``.

* ``hermes`` (Qwen2.5/Qwen3/Hermes chat templates): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  any number of them anywhere in the text. The JSON is read with a real JSON decoder from the opening tag, so
  braces, quotes or even ``</tool_call>`` inside argument strings are fine. ``"parameters"`` is accepted for
  ``"arguments"``, and arguments given as a JSON *string* holding an object are unwrapped.
* ``gpt-oss`` (OpenAI harmony): ``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}<|call|>`` (the ``<|start|>assistant`` prefix may be in the prompt instead, and the
  ``to=`` recipient may stand before ``<|channel|>``). Chain-of-thought (``analysis`` channel) is removed
  first: calls written while thinking are not calls.
"""

from __future__ import annotations

import json
import re

from hybridflow.agents.tool_parsers.base import (
    ParsedItem,
    ToolCallExtraction,
    ToolCallParseError,
    ToolParser,
    make_call,
    snippet,
)

_WS = re.compile(r"\s*")


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
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
                    f"{snippet(raw)}", raw))
                content.append(raw)
                break
            raw = text[start + len(self.start_tag):end]
            why = "extra text after the JSON object" if json_end >= 0 else "not valid JSON"
            items.append(ToolCallParseError("invalid_json", f"the tool call is {why}; write "
                                            f'{self.start_tag}{{"name": ..., "arguments": {{...}}}}{self.end_tag}: '
                                            f"{snippet(raw.strip())}", raw))
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

    def parse_text(self, text: str, tools: list | None = None) -> ToolCallExtraction:
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
                                                f"{snippet(body)}", body))
                continue
            try:
                arguments = json.loads(body) if body.strip() else {}
            except json.JSONDecodeError as e:
                items.append(ToolCallParseError("invalid_json", f"the arguments of functions.{name} are not valid "
                                                f"JSON ({e.msg}): {snippet(body)}", body))
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


__all__ = ["GptOssToolParser", "HermesToolParser"]
