"""Tool-config YAML in verl's format -> tool objects; bad files give errors naming the entry and the fix."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from hybridflow.tools import CalculatorTool, CodeInterpreterTool, Gsm8kTool, SearchTool, initialize_tools_from_config

VERL_GSM8K_YAML = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""


def write(tmp_path, text: str, name="tools.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_verl_gsm8k_tool_config_loads_unchanged(tmp_path):
    (tool,) = initialize_tools_from_config(write(tmp_path, VERL_GSM8K_YAML))
    assert isinstance(tool, Gsm8kTool) and tool.name == "calc_gsm8k_reward"
    assert tool.tool_schema.function.description == "A tool for calculating the reward of gsm8k"
    schema = tool.get_openai_tool_schema().model_dump(exclude_none=True)
    assert schema["function"]["parameters"]["required"] == ["answer"]

    async def go():
        iid, _ = await tool.create(ground_truth="42")
        await tool.execute(iid, {"answer": "42"})
        return await tool.calc_reward(iid)

    assert asyncio.run(go()) == 1.0


def test_names_paths_and_default_schemas(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "contents": "alpha"}\n')
    path = write(tmp_path, f"""
        tools:
          - class_name: calculator
          - class_name: hybridflow.tools.sandbox_fusion_tools.SandboxFusionTool
            config: {{type: native, default_timeout: 3}}
          - class_name: verl.tools.search_tool.SearchTool
            config: {{corpus_path: {corpus}, topk: 1}}
          - class_name: hybridflow.tools.calculator.CalculatorTool
            tool_schema:
              type: function
              function:
                name: calc2
                description: d
                parameters: {{type: object, properties: {{expression: {{type: string}}}}, required: [expression]}}
    """)
    tools = initialize_tools_from_config(path)
    assert [type(t) for t in tools] == [CalculatorTool, CodeInterpreterTool, SearchTool, CalculatorTool]
    assert [t.name for t in tools] == ["calculator", "code_interpreter", "search", "calc2"]
    assert tools[1].sandbox_config.timeout_s == 3


@pytest.mark.parametrize("body, message", [
    ("tools: {a: 1}", "top-level 'tools:' list"),
    ("tools:\n  - config: {}", "each tool needs 'class_name'"),
    ("tools:\n  - class_name: calculater", "neither a registered tool"),
    ("tools:\n  - class_name: no_such_pkg.mod.Tool", "cannot import module 'no_such_pkg.mod'"),
    ("tools:\n  - class_name: hybridflow.tools.calculator.evaluate", "must be a subclass"),
    ("tools:\n  - class_name: hybridflow.tools.calculator.Nope", "has no attribute 'Nope'"),
    ("tools:\n  - class_name: calculator\n    config: {type: mcpp}", "config.type='mcpp' must be 'native' or 'mcp'"),
    ("tools:\n  - class_name: calculator\n    mcp: {mcp_servers_config_path: x.json}", "needs config.type: mcp"),
    ("tools:\n  - class_name: calculator\n    config: {max_exponnent: 3}", "did you mean 'max_exponent'"),
    ("tools:\n  - class_name: calculator\n    schema: {}", "unknown key(s) ['schema']"),
    ("tools:\n  - class_name: calculator\n  - class_name: calculator", "duplicated: ['calculator']"),
    ("tools:\n  - class_name: calculator\n    tool_schema: {type: function, function: {description: x}}",
     "tools[0] (calculator)"),
])
def test_bad_tool_configs(tmp_path, body, message):
    with pytest.raises((ValueError, ImportError, TypeError, AttributeError)) as info:
        initialize_tools_from_config(write(tmp_path, body))
    assert message in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="tool_config_path"):
        initialize_tools_from_config(tmp_path / "nope.yaml")


def test_verl_sandbox_and_search_examples(tmp_path):
    # verl's examples/sglang_multiturn tool configs, as shipped (the search schema's 'item' typo included).
    sandbox = write(tmp_path, """
        tools:
          - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
            config: {"sandbox_fusion_url": "https://example.invalid/run_code", "rate_limit": 10}
            tool_schema:
              type: "function"
              function:
                name: "code_interpreter"
                description: "A tool for executing code."
                parameters: {type: "object", properties: {code: {type: "string"}}, required: ["code"]}
    """, "sandbox.yaml")
    (tool,) = initialize_tools_from_config(sandbox)
    assert isinstance(tool, CodeInterpreterTool) and tool.settings.rate_limit == 10
    search_schema = """
            tool_schema:
              type: "function"
              function:
                name: "search"
                description: "Searches the web."
                parameters:
                  type: "object"
                  properties:
                    query_list: {type: "array", item: {type: "string"}, description: "queries"}
                  required: ["query_list"]
    """
    remote = write(tmp_path, """
        tools:
          - class_name: "verl.tools.search_tool.SearchTool"
            config: {"sandbox_fusion_url": "http://127.0.0.1:8000/retrieve"}
    """ + search_schema, "remote.yaml")
    with pytest.raises(ValueError, match="replace it with 'corpus_path"):
        initialize_tools_from_config(remote)
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"Ada Lovelace\\"\\nFirst programmer."}\n')
    local = write(tmp_path, f"""
        tools:
          - class_name: "verl.tools.search_tool.SearchTool"
            config: {{corpus_path: {corpus}}}
    """ + search_schema, "local.yaml")
    (search,) = initialize_tools_from_config(local)

    async def go():
        iid, _ = await search.create()
        return await search.execute(iid, {"query_list": ["who was Ada Lovelace"]})

    assert "First programmer." in asyncio.run(go())[0].text


VERL_USER_TOOL = '''
import json
from typing import Any

from transformers.utils import get_json_schema

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


class WeatherTool(BaseTool):
    def get_current_temperature(self, location: str, unit: str = "celsius"):
        """Get current temperature at a location.

        Args:
            location: The location to get the temperature for, in the format "City, State, Country".
            unit: The unit to return the temperature in. Defaults to "celsius". (choices: ["celsius", "fahrenheit"])

        Returns:
            the temperature, the location, and the unit in a dict
        """
        return {"temperature": 26.1, "location": location, "unit": unit}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        schema = get_json_schema(self.get_current_temperature)
        return OpenAIFunctionToolSchema(**schema)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        try:
            result = self.get_current_temperature(**parameters)
            return ToolResponse(text=json.dumps(result)), 0, {}
        except Exception as e:
            return ToolResponse(text=str(e)), 0, {}
'''


def test_a_verl_user_tool_file_works_after_renaming_verl(tmp_path, monkeypatch):
    import sys

    from hybridflow.tools import ToolExecutor

    (tmp_path / "weather_tools.py").write_text(VERL_USER_TOOL.replace("from verl.", "from hybridflow."))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(tmp_path, """
        tools:
          - class_name: weather_tools.WeatherTool
            config: {type: native}
    """)
    try:
        (tool,) = initialize_tools_from_config(path)
        schema = tool.tool_schema.model_dump(exclude_unset=True, exclude_none=True)
        assert schema["function"]["name"] == "get_current_temperature"
        assert schema["function"]["parameters"]["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"]
        out = asyncio.run(ToolExecutor([tool]).call("get_current_temperature", '{"location": "Paris"}'))
        assert out.ok and '"temperature": 26.1' in out.text
    finally:
        sys.modules.pop("weather_tools", None)
