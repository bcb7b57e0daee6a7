"""Tool-call parsers (hybridflow.agents.tool_parser) on tricky model outputs, from token ids as the agent loop does."""

from __future__ import annotations

import asyncio
import json

import pytest

from hybridflow.agents.tool_parser import FunctionCall, ToolCallParseError, ToolParser
from hybridflow.tools import CalculatorTool, ToolExecutor

HARMONY_SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|end|>", "<|return|>"]


@pytest.fixture(scope="module")
def tok():
    """Byte-level BPE (round-trips any unicode) with the harmony markers as special tokens."""
    from hybridflow.utils.tiny_model import build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_SPECIALS})
    return tokenizer


def parse(tok, name: str, text: str):
    parser = ToolParser.get_tool_parser(name, tok)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text  # the test exercises parsing, not decoding
    return asyncio.run(parser.extract_tool_calls_with_errors(ids)), asyncio.run(parser.extract_tool_calls(ids))


def call(name, **arguments):
    return FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def test_registry_and_unknown_format(tok):
    assert {"hermes", "gpt-oss"} <= set(ToolParser.names())
    with pytest.raises(ValueError, match="multi_turn.format: Unknown tool-call format 'qwen'.*hermes"):
        ToolParser.get_tool_parser("qwen", tok)


def test_hermes_several_calls_inside_text(tok):
    text = ('Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "12*7"}}\n</tool_call>'
            ' and also <tool_call>{"name": "search", "arguments": {"query_list": ["a", "b"]}}</tool_call> done.')
    found, (content, calls) = parse(tok, "hermes", text)
    assert calls == found.calls == [call("calculator", expression="12*7"), call("search", query_list=["a", "b"])]
    assert found.errors == []
    assert content == found.content == "Let me compute.  and also  done."


def test_hermes_nested_braces_quotes_and_closing_tag_inside_strings(tok):
    args = {"code": 'd = {"a": {"b": [1, 2]}}\nprint("}</tool_call>{", d)', "opts": {"deep": {"x": 'say "q"'}}}
    text = "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": args}) + "</tool_call>"
    found, _ = parse(tok, "hermes", text)
    assert found.errors == [] and len(found.calls) == 1
    assert json.loads(found.calls[0].arguments) == args and found.content == ""


def test_hermes_unicode_is_kept_unescaped(tok):
    text = '<tool_call>{"name": "search", "arguments": {"query_list": ["Zürich 北京 😀"]}}</tool_call>'
    found, _ = parse(tok, "hermes", text)
    assert found.calls[0].arguments == '{"query_list": ["Zürich 北京 😀"]}'


def test_hermes_malformed_blocks_are_errors_in_order(tok):
    text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+"</tool_call>'  # unbalanced
            '<tool_call>{"arguments": {}}</tool_call>'                                      # no name
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>'  # fine
            '<tool_call>["calculator"]</tool_call>'                                           # not an object
            '<tool_call>{"name": "a"} trailing</tool_call>'                                   # text after JSON
            'tail <tool_call>{"name": "calculator", "arguments": {"expr')                     # cut off
    found, (content, calls) = parse(tok, "hermes", text)
    kinds = [i.kind if isinstance(i, ToolCallParseError) else "call" for i in found.items]
    assert kinds == ["invalid_json", "missing_name", "call", "invalid_json", "invalid_json", "unterminated"]
    assert calls == [call("calculator", expression="2")]
    assert "not valid JSON" in found.errors[0].message and "extra text" in found.errors[3].message
    assert content.startswith("tail <tool_call>{")  # the cut-off block stays in the content


def test_hermes_argument_variants(tok):
    text = ('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>'
            '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>'
            '<tool_call>{"name": "h"}</tool_call>'
            '<tool_call>{"name": "k", "arguments": "not json"}</tool_call>')
    found, _ = parse(tok, "hermes", text)
    assert [(c.name, c.arguments) for c in found.calls] == [("f", '{"x": 1}'), ("g", '{"y": 2}'), ("h", "{}"),
                                                             ("k", "not json")]


def test_hermes_no_calls(tok):
    found, (content, calls) = parse(tok, "hermes", "The answer is 42.")
    assert calls == [] and found.items == [] and content == "The answer is 42."


def test_parse_errors_and_calls_feed_the_executor(tok):
    text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
            '<tool_call>{"name": "calculator", "arguments": {"expression": 1+}}</tool_call>')
    found, _ = parse(tok, "hermes", text)
    ex = ToolExecutor([CalculatorTool()])

    async def answer():
        out = []
        for item in found.items:
            if isinstance(item, FunctionCall):
                out.append(await ex.call(item.name, item.arguments))
            else:
                out.append(ex.parse_error_outcome(item.message))
        return out

    ok, bad = asyncio.run(answer())
    assert ok.text == "42" and bad.error_kind == "parse_error" and "not valid JSON" in bad.text


def test_gpt_oss_calls_with_and_without_start_prefix(tok):
    text = ("<|channel|>analysis<|message|>Maybe call to=functions.fake <|constrain|>json<|message|>{}<|call|>"
            "<|end|>"
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"location": "Zürich", "units": {"t": "C"}}<|call|>'
            "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{\"q\": \"x\"}<|call|>")
    found, (content, calls) = parse(tok, "gpt-oss", text)
    assert calls == [call("get_weather", location="Zürich", units={"t": "C"}), call("lookup", q="x")]
    assert found.errors == [] and "fake" not in content


def test_gpt_oss_analysis_is_dropped_and_final_text_kept(tok):
    text = ("<|start|>assistant<|channel|>analysis<|message|>thinking about to=functions.x<|end|>"
            "<|start|>assistant<|channel|>final<|message|>It is 42.<|return|>")
    found, (content, calls) = parse(tok, "gpt-oss", text)
    assert calls == [] and found.errors == []
    assert "It is 42." in content and "thinking" not in content


def test_gpt_oss_bad_and_unterminated_calls(tok):
    text = ("<|channel|>commentary to=functions.a <|constrain|>json<|message|>{\"x\": <|call|>"
            "<|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"y\": 1")
    found, (_, calls) = parse(tok, "gpt-oss", text)
    assert calls == [] and [e.kind for e in found.errors] == ["invalid_json", "unterminated"]
    assert "functions.a" in found.errors[0].message


def test_gpt_oss_tool_response_text(tok):
    parser = ToolParser.get_tool_parser("gpt-oss", tok)
    assert parser.format_tool_responses(["18C"], ["get_weather"]) == (
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18C<|end|><|start|>assistant")
    assert ToolParser.get_tool_parser("hermes", tok).format_tool_responses(["x"], ["f"]) is None
