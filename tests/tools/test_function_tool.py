"""@function_tool: schema from hints + docstring, sync/async bodies, a user's tool file named in the tool YAML.

verl's API (registry, path loading, return normalisation) is covered in tests/compat/test_function_tool_compat.py.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading

import pytest

from hybridflow.tools import ToolExecutor, ToolResponse, function_tool, initialize_tools_from_config
from hybridflow.tools.function_tool import FUNCTION_TOOL_REGISTRY, FunctionTool


@function_tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


@function_tool(name="weather", description="Current temperature.")
async def get_weather(location: str, unit: str = "celsius") -> dict:
    """Get the temperature.

    Args:
        location: city name
        unit: the unit (choices: ["celsius", "fahrenheit"])
    """
    await asyncio.sleep(0)
    return {"location": location, "temperature": 21 if unit == "celsius" else 70}


def test_schema_from_hints_and_docstring():
    assert multiply(3, 4) == 12  # the decorator returns the function itself
    tool = FUNCTION_TOOL_REGISTRY["multiply"]
    assert isinstance(tool, FunctionTool) and tool.fn is multiply and not tool.is_async
    schema = tool.tool_schema.model_dump(exclude_none=True)
    assert schema["function"]["name"] == "multiply"
    assert schema["function"]["description"] == "Multiply two integers exactly."
    assert schema["function"]["parameters"] == {
        "type": "object", "required": ["a", "b"],
        "properties": {"a": {"type": "integer", "description": "the first factor"},
                       "b": {"type": "integer", "description": "the second factor"}}}
    weather = FUNCTION_TOOL_REGISTRY["weather"].tool_schema.function
    assert weather.name == "weather" and weather.description == "Current temperature."
    assert weather.parameters.properties["unit"].enum == ["celsius", "fahrenheit"]
    assert weather.parameters.required == ["location"]


def test_sync_runs_in_a_thread_and_async_is_awaited():
    seen = {}

    @function_tool
    def where(x: int) -> str:
        """Report the thread.

        Args:
            x: a number
        """
        seen["thread"] = threading.current_thread() is threading.main_thread()
        return f"x={x}"

    ex = ToolExecutor([FUNCTION_TOOL_REGISTRY[n] for n in ("where", "weather", "multiply")])

    async def go():
        return (await ex.call("where", '{"x": 5}'), await ex.call("weather", '{"location": "Oslo"}'),
                await ex.call("multiply", {"a": 6, "b": 7}), await ex.call("multiply", {"a": 6}))

    text, weather, product, missing = asyncio.run(go())
    assert text.text == "x=5" and seen["thread"] is False
    assert weather.text == '{"location": "Oslo", "temperature": 21}'
    assert product.text == "42"
    assert missing.error_kind == "invalid_arguments" and "['b']" in missing.text


def test_kwargs_receive_create_and_execute_kwargs_and_tuples_pass_through():
    @function_tool
    def check(answer: str, **kwargs) -> tuple:
        """Check an answer.

        Args:
            answer: the proposed answer
        """
        ok = answer == kwargs["ground_truth"]
        return ToolResponse(text="correct" if ok else "wrong"), float(ok), {"attempt": kwargs["attempt"]}

    assert "kwargs" not in FUNCTION_TOOL_REGISTRY["check"].tool_schema.function.parameters.properties
    ex = ToolExecutor([FUNCTION_TOOL_REGISTRY["check"]])
    kwargs = {"check": {"create_kwargs": {"ground_truth": "7"}, "execute_kwargs": {"attempt": 1}}}
    out = asyncio.run(ex.call("check", '{"answer": "7"}', kwargs))
    assert (out.text, out.step_reward, out.metrics) == ("correct", 1.0, {"attempt": 1})


def test_a_raising_function_is_a_counted_error():
    @function_tool
    def broken(n: int) -> int:
        """Always fails.

        Args:
            n: ignored
        """
        raise ZeroDivisionError("no")

    out = asyncio.run(ToolExecutor([FUNCTION_TOOL_REGISTRY["broken"]]).call("broken", '{"n": 1}'))
    assert out.error_kind == "tool_exception" and "ZeroDivisionError: no" in out.text


def test_undocumented_or_untyped_functions_are_refused():
    with pytest.raises(TypeError, match="@function_tool .*no description for the argument 'b'"):
        @function_tool
        def f(a: int, b: int) -> int:
            """Adds.

            Args:
                a: first
            """
    with pytest.raises(TypeError, match="missing a type hint"):
        @function_tool
        def g(a) -> int:
            """Adds.

            Args:
                a: first
            """


def test_user_tool_file_named_in_tool_yaml(tmp_path, monkeypatch):
    (tmp_path / "my_user_tools.py").write_text(textwrap.dedent('''
        from hybridflow.tools import function_tool

        @function_tool
        def reverse(text: str) -> str:
            """Reverse a string.

            Args:
                text: what to reverse
            """
            return text[::-1]
    '''))
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: my_user_tools.reverse\n    config: {type: native}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        (tool,) = initialize_tools_from_config(tmp_path / "tools.yaml")
        out = asyncio.run(ToolExecutor([tool]).call("reverse", '{"text": "abc"}'))
        assert tool.name == "reverse" and out.text == "cba"
    finally:
        sys.modules.pop("my_user_tools", None)
