"""Every tool-call format verl ships (``verl.experimental.agent_loop.tool_parser``, Aug 2026) on tricky outputs:
nested JSON, several calls, malformed and cut-off calls, unicode. Each case goes through the tokenizer as the
agent loop does (token ids -> text -> calls)."""

from __future__ import annotations

import asyncio
import json

import pytest

from hybridflow.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from hybridflow.tools.schemas import OpenAIFunctionToolSchema

VERL_FORMATS = {"hermes", "gpt-oss", "qwen3_coder", "glm", "seed", "minimax", "kimi", "deepseek_v4", "gemma4"}
SPECIALS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|end|>", "<|im_end|>",
            "<|observation|>", "<|tool_call>", "<tool_call|>", "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"]


@pytest.fixture(scope="module")
def tok():
    from hybridflow.utils.tiny_model import build_bpe_tokenizer

    tokenizer = build_bpe_tokenizer()  # byte-level: any unicode text round-trips
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    return tokenizer


def tools(*specs):
    return [OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": name, "description": name, "parameters": {"type": "object", "properties": props,
                                                          "required": required}}}) for name, props, required in specs]


WEATHER = ("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                           "ratio": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
                           "when": {"type": ["integer", "string"]}}, ["city"])
SEARCH = ("search", {"query_list": {"type": "array"}}, ["query_list"])
TOOLS = tools(WEATHER, SEARCH)


def parse(tok, fmt, text, schemas=TOOLS):
    parser = ToolParser.get_tool_parser(fmt, tok)
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=False) == text
    found = asyncio.run(parser.extract_tool_calls_with_errors(ids, schemas))
    content, calls = asyncio.run(parser.extract_tool_calls(ids, schemas))
    assert calls == found.calls and content == found.content
    return found


def args(call: FunctionCall) -> dict:
    return json.loads(call.arguments)


def test_every_verl_format_is_registered(tok):
    assert VERL_FORMATS <= set(ToolParser.names())
    for fmt in VERL_FORMATS:
        assert ToolParser.get_tool_parser(fmt, tok).parse_text("no calls here").items == []


# --------------------------------------------------------------------------------------------- qwen3_coder
def test_qwen3_coder_converts_values_to_the_schema_types(tok):
    text = ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo 🌧\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\n2.0\n"
            "</parameter>\n<parameter=opts>\n{\"a\": {\"b\": [1, 2]}}\n</parameter>\n<parameter=tags>\n['x', 'y']\n"
            "</parameter>\n<parameter=when>\nnull\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n"
            "</tool_call>")
    found = parse(tok, "qwen3_coder", text)
    (call,) = found.calls
    assert call.name == "get_weather" and found.content == "Checking.\n"
    assert args(call) == {"city": "São Paulo 🌧", "days": 3, "metric": True, "ratio": 2, "opts": {"a": {"b": [1, 2]}},
                          "tags": ["x", "y"], "when": None, "extra": "7"}  # not in the schema: kept as text


def test_qwen3_coder_several_calls_a_cut_off_one_and_a_malformed_one(tok):
    text = ("<tool_call>\n<function=search>\n<parameter=query_list>\n[\"a\", \"b\"]\n</parameter>\n</function>\n"
            "</tool_call>\n<tool_call>\n<function=broken\n<parameter=x>1</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo")
    found = parse(tok, "qwen3_coder", text)
    assert [i.__class__.__name__ for i in found.items] == ["FunctionCall", "FunctionCall", "FunctionCall"]
    first, broken, partial = found.items
    assert args(first) == {"query_list": ["a", "b"]}
    assert broken.name.startswith("broken")  # verl reads up to the first '>', as here
    assert partial.name == "get_weather" and args(partial) == {"city": "Oslo"}  # verl runs cut-off calls too
    no_function = parse(tok, "qwen3_coder", "<tool_call>\njust text\n</tool_call>")
    assert no_function.calls == [] and no_function.errors[0].kind == "missing_name"
    no_close = parse(tok, "qwen3_coder", "<tool_call>\n<function=get_weather")
    assert no_close.errors[0].kind == "missing_name"


def test_qwen3_coder_values_of_the_wrong_type_stay_text(tok):
    text = "<tool_call><function=get_weather><parameter=days>three</parameter><parameter=metric>maybe</parameter>" \
           "<parameter=when>5</parameter></function></tool_call>"
    (call,) = parse(tok, "qwen3_coder", text).calls
    assert args(call) == {"days": "three", "metric": "maybe", "when": 5}  # the executor reports the bad types


# --------------------------------------------------------------------------------------------- glm
def test_glm_pairs_nested_json_unicode_and_thinking(tok):
    text = ("<think>plan</think>Sure.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>東京</arg_value>\n"
            "<arg_key>opts</arg_key>\n<arg_value>{\"deep\": {\"x\": [1, {\"y\": null}]}}</arg_value>\n</tool_call>"
            "<tool_call>search<arg_key>query_list</arg_key><arg_value>[\"q\"]</arg_value></tool_call>"
            "<tool_call>no_args</tool_call><tool_call>get_weather<arg_key>city")
    found = parse(tok, "glm", text)
    weather, search, no_args, cut = found.items
    assert found.content == "Sure."
    assert args(weather) == {"city": "東京", "opts": {"deep": {"x": [1, {"y": None}]}}}
    assert args(search) == {"query_list": ["q"]} and (no_args.name, args(no_args)) == ("no_args", {})
    assert cut.kind == "unterminated"
    assert ToolParser.get_tool_parser("glm", tok).stop_token_ids == [tok.convert_tokens_to_ids("<|observation|>")]


# --------------------------------------------------------------------------------------------- seed / minimax
def test_seed_calls_and_errors(tok):
    text = ("ok<seed:tool_call>\n<function=get_weather>\n<parameter=city>Zürich</parameter>\n<parameter=days>2"
            "</parameter>\n</function>\n</seed:tool_call><seed:tool_call><function=search>\n"
            "<parameter=query_list>[1, [2, {\"3\": 4}]]</parameter></function></seed:tool_call>"
            "<seed:tool_call>nothing</seed:tool_call><seed:tool_call><function=x>")
    found = parse(tok, "seed", text)
    assert found.content == "ok"
    weather, search, empty, cut = found.items
    assert args(weather) == {"city": "Zürich", "days": 2} and args(search) == {"query_list": [1, [2, {"3": 4}]]}
    assert (empty.kind, cut.kind) == ("missing_name", "unterminated")


def test_minimax_several_invokes_in_one_block(tok):
    text = ('I will call two tools.<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">"Kyiv"'
            '</parameter>\n<parameter name="opts">{"u": "°C"}</parameter>\n</invoke>\n<invoke name="search">'
            '<parameter name="query_list">["a</invoke>b"]</parameter></invoke>\n</minimax:tool_call>'
            "<minimax:tool_call>oops</minimax:tool_call>")
    found = parse(tok, "minimax", text)
    weather, search, bad = found.items
    assert found.content == "I will call two tools."
    assert args(weather) == {"city": "Kyiv", "opts": {"u": "°C"}}
    assert search.name == "search" and bad.kind == "missing_name"


# --------------------------------------------------------------------------------------------- kimi
def test_kimi_ids_names_and_bad_arguments(tok):
    text = ("Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
            "<|tool_call_argument_begin|>{\"city\": \"Αθήνα\", \"opts\": {\"n\": [1, {\"m\": 2}]}}<|tool_call_end|>"
            "<|tool_call_begin|>search-tool-1<|tool_call_argument_begin|>{}<|tool_call_end|>"
            "<|tool_call_begin|>call_7<|tool_call_argument_begin|>{\"query_list\": []}<|tool_call_end|>"
            "<|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>{city: oops}<|tool_call_end|>"
            "<|tool_call_begin|>functions.search:4<|tool_call_argument_begin|>{\"query_list\"")
    found = parse(tok, "kimi", text)
    weather, by_substring, by_schema, bad_json, cut = found.items
    assert found.content == "Let me look."
    assert (weather.name, weather.tool_call_id) == ("get_weather", "functions.get_weather:0")
    assert args(weather) == {"city": "Αθήνα", "opts": {"n": [1, {"m": 2}]}}
    assert by_substring.name == "search" and by_schema.name == "search"  # verl's name inference
    assert (bad_json.kind, cut.kind) == ("invalid_json", "unterminated")
    assert ToolParser.get_tool_parser("kimi", tok).stop_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]


# --------------------------------------------------------------------------------------------- deepseek_v4
def test_deepseek_v4_string_and_json_parameters(tok):
    d = "｜DSML｜"
    text = (f"thinking about it</think>Answer first.\n\n<{d}tool_calls>\n<{d}invoke name=\"get_weather\">\n"
            f"<{d}parameter name=\"city\" string=\"true\">{{not json}} 🙂</{d}parameter>\n"
            f"<{d}parameter name=\"days\" string=\"false\">5</{d}parameter>\n"
            f"<{d}parameter name=\"opts\" string=\"false\">{{\"a\": [1, {{\"b\": true}}]}}</{d}parameter>\n"
            f"</{d}invoke>\n<{d}invoke name=\"search\">\n<{d}parameter name=\"query_list\" string=\"false\">"
            f"[\"q\"]</{d}parameter>\n</{d}invoke>\n</{d}tool_calls><｜end▁of▁sentence｜>")
    found = parse(tok, "deepseek_v4", text)
    weather, search = found.calls
    assert found.content == "Answer first." and found.errors == []
    assert args(weather) == {"city": "{not json} 🙂", "days": 5, "opts": {"a": [1, {"b": True}]}}
    assert args(search) == {"query_list": ["q"]}
    assert parse(tok, "deepseek_v4", "reasoning</think>Just text.").content == "Just text."
    assert parse(tok, "deepseek_v4", f"<{d}tool_calls><{d}invoke name=\"x\">").errors[0].kind == "unterminated"


# --------------------------------------------------------------------------------------------- gemma4
def test_gemma4_quoted_bare_and_nested_values(tok):
    q = '<|"|>'
    text = (f"Sure.<|tool_call>call:get_weather{{city:{q}Rio, {{de}} Janeiro{q},days:3,metric:false,ratio:0.5,"
            f"when:null,opts:{{unit:{q}°C{q},deep:{{x:[1,{q}a,b{q}]}}}},tags:[]}}<tool_call|>"
            f"<|tool_call>call:search{{query_list:[{q}x{q}]}}<tool_call|>"
            f"<|tool_call>call:get_weather{{city {q}x{q}}}<tool_call|><|tool_call>notacall<tool_call|>"
            f"<|tool_call>call:search{{query_list:[")
    found = parse(tok, "gemma4", text)
    weather, search, bad, no_name, cut = found.items
    assert found.content == "Sure."
    assert args(weather) == {"city": "Rio, {de} Janeiro", "days": 3, "metric": False, "ratio": 0.5, "when": None,
                             "opts": {"unit": "°C", "deep": {"x": [1, "a,b"]}}, "tags": []}
    assert args(search) == {"query_list": ["x"]}
    assert (bad.kind, no_name.kind, cut.kind) == ("invalid_json", "missing_name", "unterminated")
    assert ToolParser.get_tool_parser("gemma4", tok).stop_token_ids == [tok.convert_tokens_to_ids("<tool_call|>")]


# --------------------------------------------------------------------------------------------- hermes / gpt-oss
def test_hermes_and_gpt_oss_still_read_tricky_calls(tok):
    args_in = {"code": 'print("}</tool_call>{")', "opts": {"deep": {"x": "ünï"}}}
    text = "<tool_call>" + json.dumps({"name": "search", "arguments": args_in}, ensure_ascii=False) + "</tool_call>"
    assert args(parse(tok, "hermes", text).calls[0]) == args_in
    harmony = ("<|channel|>analysis<|message|>maybe call x<|end|><|start|>assistant<|channel|>commentary "
               "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Lyon\"}<|call|>")
    (call,) = parse(tok, "gpt-oss", harmony).calls
    assert call.name == "get_weather" and args(call) == {"city": "Lyon"}
