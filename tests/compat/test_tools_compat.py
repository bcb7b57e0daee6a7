"""verl's function-tool API (``verl.tools.function_tool``) and mixed tool loading (``verl.tools.tool_registry``)
at hybridflow's paths, written from verl's documented behaviour (docstrings and tests of Aug 2026).

Deliberate difference: a function declaring ``**kwargs`` is accepted here (it receives the sample's
create/execute kwargs); verl refuses every variadic parameter. ``*args`` is refused in both.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
from typing import Literal

import pytest

from hybridflow.tools import function_tool as function_tool_mod
from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.executor import ToolExecutor
from hybridflow.tools.function_tool import (
    FUNCTION_TOOL_REGISTRY,
    FunctionTool,
    function_tool,
    get_function_tool,
    load_function_tools_from_path,
    normalize_function_tool_return,
)
from hybridflow.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
from hybridflow.tools.tool_registry import get_tool_class, initialize_tools_from_config, load_all_tools


@pytest.fixture(autouse=True)
def clean_registry():
    """Each test starts from an empty registry; what other test modules registered is put back after."""
    saved, saved_paths = dict(FUNCTION_TOOL_REGISTRY), dict(function_tool_mod._LOADED_FUNCTION_TOOL_PATHS)
    FUNCTION_TOOL_REGISTRY.clear()
    function_tool_mod._LOADED_FUNCTION_TOOL_PATHS.clear()
    yield
    FUNCTION_TOOL_REGISTRY.clear()
    FUNCTION_TOOL_REGISTRY.update(saved)
    function_tool_mod._LOADED_FUNCTION_TOOL_PATHS.clear()
    function_tool_mod._LOADED_FUNCTION_TOOL_PATHS.update(saved_paths)


def schema_of(name: str) -> dict:
    return FUNCTION_TOOL_REGISTRY[name].tool_schema.model_dump(exclude_unset=True, exclude_none=True)["function"]


# --------------------------------------------------------------------------------------------- decorator
def test_named_decorator_registers_a_carrier_and_returns_the_function():
    @function_tool("greet")
    def hello(name: str, excited: bool = False) -> str:
        """Greet someone.

        Args:
            name: Person to greet.
            excited: Whether to add an exclamation mark.
        """
        return f"hi {name}{'!' if excited else ''}"

    assert hello("a", True) == "hi a!"  # still the plain function
    tool = FUNCTION_TOOL_REGISTRY["greet"]
    assert isinstance(tool, FunctionTool) and not isinstance(tool, BaseTool) and tool.fn is hello
    fn = schema_of("greet")
    assert fn["name"] == "greet" and fn["description"].startswith("Greet someone.")
    assert fn["parameters"]["properties"]["name"] == {"type": "string", "description": "Person to greet."}
    assert fn["parameters"]["properties"]["excited"]["type"] == "boolean"
    assert fn["parameters"]["required"] == ["name"]
    assert get_function_tool("greet") is tool
    with pytest.raises(KeyError, match="function_tool_path"):
        get_function_tool("absent")


@pytest.mark.parametrize("form", ["bare", "empty_parens"])
def test_bare_and_empty_parentheses_use_the_function_name(form):
    def my_tool(x: int) -> int:
        """Doc.

        Args:
            x: A number.
        """
        return x

    (function_tool(my_tool) if form == "bare" else function_tool()(my_tool))
    assert schema_of("my_tool")["parameters"]["properties"]["x"]["type"] == "integer"


def test_union_and_literal_types_reach_the_schema():
    @function_tool("num")
    def num(x: int | float, pick: Literal[1, 2, 3]) -> str:
        """Numeric.

        Args:
            x: a numeric value.
            pick: pick one.
        """
        return str(x)

    props = schema_of("num")["parameters"]["properties"]
    assert "number" in props["x"]["type"] and props["pick"]["enum"] == [1, 2, 3]


def test_an_explicit_schema_replaces_inference():
    custom = {"type": "function", "function": {"name": "x", "description": "custom desc",
                                               "parameters": {"type": "object", "properties": {}, "required": []}}}

    @function_tool("x", schema=custom)
    def x() -> str:  # no docstring needed
        return ""

    assert schema_of("x")["description"] == "custom desc" and schema_of("x")["parameters"]["properties"] == {}
    obj = OpenAIFunctionToolSchema.model_validate({**custom, "function": {**custom["function"], "name": "y"}})

    @function_tool("y", schema=obj)
    def y() -> str:
        return ""

    assert FUNCTION_TOOL_REGISTRY["y"].tool_schema is obj


def test_a_second_function_under_a_taken_name_is_refused():
    def first(x: str) -> str:
        """Doc.

        Args:
            x: a string.
        """
        return x

    function_tool("dup")(first)
    function_tool("dup")(first)  # the same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        @function_tool("dup")
        def second(x: str) -> str:
            """Doc.

            Args:
                x: a string.
            """
            return x


def test_sync_runs_in_a_thread_async_is_awaited():
    @function_tool("aecho")
    async def aecho(text: str) -> str:
        """Echo.

        Args:
            text: text.
        """
        return text

    @function_tool("secho")
    def secho(text: str) -> str:
        """Echo.

        Args:
            text: text.
        """
        return text.upper()

    assert FUNCTION_TOOL_REGISTRY["aecho"].is_async and not FUNCTION_TOOL_REGISTRY["secho"].is_async
    assert asyncio.run(FUNCTION_TOOL_REGISTRY["aecho"].call({"text": "ok"})) == "ok"
    assert asyncio.run(FUNCTION_TOOL_REGISTRY["secho"].call({"text": "hi"})) == "HI"


@pytest.mark.parametrize("source, message", [
    ("def f(x: str) -> str:\n    return x\n", "no docstring"),
    ('def f(x) -> str:\n    """Doc.\n\n    Args:\n        x: a thing.\n    """\n    return x\n', "missing a type hint"),
    ('def f(x: int, y: int) -> int:\n    """Add.\n\n    Args:\n        x: only x.\n    """\n    return x\n',
     "no description for the argument"),
])
def test_undocumented_functions_are_refused_at_registration(source, message):
    scope: dict = {}
    exec(source, scope)
    with pytest.raises(Exception, match=message):
        function_tool("f")(scope["f"])
    assert "f" not in FUNCTION_TOOL_REGISTRY


def test_star_args_are_refused_and_kwargs_are_a_hybridflow_extension():
    with pytest.raises(ValueError, match="variadic parameter"):
        @function_tool("varargs")
        def varargs(x: int, *args: int) -> int:
            """Sum.

            Args:
                x: x.
            """
            return x

    @function_tool("with_kwargs")  # verl: ValueError; here **kwargs receives create/execute kwargs
    def with_kwargs(answer: str, **kwargs) -> str:
        """Check.

        Args:
            answer: the answer.
        """
        return "correct" if answer == kwargs.get("ground_truth") else "wrong"

    assert "kwargs" not in schema_of("with_kwargs")["parameters"]["properties"]
    with pytest.raises(ValueError, match=r"variadic parameter.*\*\*kwargs"):  # typed: model arguments, as verl
        @function_tool("typed_kwargs")
        def typed_kwargs(x: int, **kwargs: int) -> int:
            """Sum.

            Args:
                x: x.
            """
            return x
    assert "typed_kwargs" not in FUNCTION_TOOL_REGISTRY and "varargs" not in FUNCTION_TOOL_REGISTRY
    out = asyncio.run(ToolExecutor([FUNCTION_TOOL_REGISTRY["with_kwargs"]]).call(
        "with_kwargs", {"answer": "7"}, {"with_kwargs": {"create_kwargs": {"ground_truth": "7"}}}))
    assert out.text == "correct"


# --------------------------------------------------------------------------------------------- loading files
def write(tmp_path, body: str, name: str = "my_tools.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


TWO_TOOLS = """
from hybridflow.tools.function_tool import function_tool

@function_tool("get_weather")
def get_weather(city: str) -> dict:
    '''Get the current weather for a city.

    Args:
        city: the city to look up.
    '''
    return {"temperature_c": 17.3, "condition": "drizzle"}

@function_tool("calculator")
def calculator(expression: str) -> str:
    '''Evaluate an arithmetic expression.

    Args:
        expression: a python-style arithmetic expression.
    '''
    return str(eval(expression, {"__builtins__": {}}, {}))
"""


def test_loading_a_file_returns_only_its_tools_once(tmp_path, monkeypatch):
    @function_tool("preexisting")
    def preexisting(x: str) -> str:
        """Pre.

        Args:
            x: x.
        """
        return x

    path = write(tmp_path, TWO_TOOLS)
    first = load_function_tools_from_path(path)
    assert sorted(t.name for t in first) == ["calculator", "get_weather"]
    assert FUNCTION_TOOL_REGISTRY["calculator"] is next(t for t in first if t.name == "calculator")
    second = load_function_tools_from_path(path)  # not executed again (would re-register new functions)
    assert [t.fn for t in second] == [t.fn for t in first]
    monkeypatch.chdir(tmp_path)
    assert load_function_tools_from_path("my_tools.py") == first  # relative to the working directory
    with pytest.raises(FileNotFoundError, match="function_tool_path does not exist"):
        load_function_tools_from_path("/nonexistent/path/here.py")


def test_a_file_without_decorators_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert load_function_tools_from_path(write(tmp_path, "x = 1\n")) == []
    assert any("no @function_tool decorators found" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------------------------- return values
@pytest.mark.parametrize("ret, text, reward, metrics", [
    ("hello", "hello", 0.0, {}),
    ({"a": 1, "b": "two"}, '{"a": 1, "b": "two"}', 0.0, {}),
    (("text", 1.5), "text", 1.5, {}),
    (("text", 2.0, {"k": "v"}), "text", 2.0, {"k": "v"}),
    (("text", None), "text", 0.0, {}),
    (("text", None, None), "text", 0.0, {}),
    (("t", 0), "t", 0.0, {}),
    (("t", False), "t", 0.0, {}),
    ((ToolResponse(text="r"),), "r", 0.0, {}),
    (42, "42", 0.0, {}),
])
def test_normalize_function_tool_return(ret, text, reward, metrics):
    response, r, m = normalize_function_tool_return(ret)
    assert isinstance(response, ToolResponse) and response.text == text
    assert r == reward and isinstance(r, float) and m == metrics


def test_normalize_passes_a_tool_response_through_and_refuses_odd_tuples():
    src = ToolResponse(text="x")
    assert normalize_function_tool_return(src)[0] is src
    for bad in ((), ("a", 1, {}, "extra")):
        with pytest.raises(TypeError, match="length 1, 2, or 3"):
            normalize_function_tool_return(bad)

    class Foo:
        def __str__(self):
            return "FOO"

    assert normalize_function_tool_return(Foo())[0].text == "FOO"


# --------------------------------------------------------------------------------------------- mixed loading
STUB_TOOLS = '''
from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.schemas import ToolResponse


class StubSearchTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=" ".join("hits-for:" + q for q in parameters["query_list"])), 0.0, \\
            {"num_queries": len(parameters["query_list"])}
'''

NATIVE_YAML = """
tools:
  - class_name: stub_search_tools.StubSearchTool
    config: {retrieval_service_url: "http://stub/retrieve", type: native}
    tool_schema:
      type: function
      function:
        name: search
        description: Stub web search.
        parameters:
          type: object
          properties: {query_list: {type: array, description: queries}}
          required: [query_list]
"""


@pytest.fixture
def native_yaml(tmp_path):
    (tmp_path / "stub_search_tools.py").write_text(STUB_TOOLS)
    path = tmp_path / "all_tool_config.yaml"
    path.write_text(NATIVE_YAML)
    return str(path)


def test_load_all_tools_mixes_native_and_function_tools(native_yaml, tmp_path):
    assert load_all_tools(tool_config_path=None, function_tool_path=None) == []
    native_only = load_all_tools(native_yaml, None)
    assert [t.name for t in native_only] == ["search"] and FUNCTION_TOOL_REGISTRY == {}
    tools = {t.name: t for t in load_all_tools(native_yaml, write(tmp_path, TWO_TOOLS))}
    assert sorted(tools) == ["calculator", "get_weather", "search"]
    assert isinstance(tools["search"], BaseTool) and type(tools["search"]).__name__ == "StubSearchTool"
    assert isinstance(tools["get_weather"], FunctionTool) and not isinstance(tools["get_weather"], BaseTool)
    raw = asyncio.run(tools["get_weather"].call({"city": "Tokyo"}))
    assert "drizzle" in normalize_function_tool_return(raw)[0].text
    again = {t.name: t for t in load_all_tools(native_yaml, str(tmp_path / "my_tools.py"))}
    assert again["calculator"] is tools["calculator"] and again["search"] is not tools["search"]


def test_the_executor_runs_both_kinds(native_yaml, tmp_path):
    ex = ToolExecutor(load_all_tools(native_yaml, write(tmp_path, TWO_TOOLS)))

    async def go():
        return (await ex.call("calculator", '{"expression": "2 + 3 * 4"}'),
                await ex.call("search", {"query_list": ["foo", "bar"]}))

    calc, search = asyncio.run(go())
    assert calc.ok and calc.text == "14"
    assert search.ok and search.text == "hits-for:foo hits-for:bar" and search.metrics == {"num_queries": 2}


def test_name_collisions_are_listed_together(native_yaml, tmp_path):
    colliding = write(tmp_path, '''
        from hybridflow.tools.function_tool import function_tool

        @function_tool("search")
        def search(query_list: list) -> str:
            """Collides.

            Args:
                query_list: queries.
            """
            return ""
        ''', "colliding.py")
    with pytest.raises(ValueError, match=r"\['search'\].*collide"):
        load_all_tools(native_yaml, colliding)


def test_a_decorated_function_is_a_valid_tool_yaml_class_name(tmp_path):
    write(tmp_path, TWO_TOOLS, "yaml_function_tools.py")
    (tmp_path / "tools.yaml").write_text("tools:\n  - class_name: yaml_function_tools.get_weather\n"
                                         "    config: {type: native}\n")
    import sys

    try:
        (tool,) = initialize_tools_from_config(tmp_path / "tools.yaml")
        assert isinstance(tool, BaseTool) and tool.name == "get_weather"
        out = asyncio.run(ToolExecutor([tool]).call("get_weather", {"city": "Oslo"}))
        assert out.ok and "drizzle" in out.text
    finally:
        sys.modules.pop("yaml_function_tools", None)


def test_bad_tool_class_paths_raise_verls_exception_types():
    with pytest.raises(ModuleNotFoundError, match="no_such_pkg"):
        get_tool_class("no_such_pkg.mod.Tool")
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        get_tool_class("hybridflow.tools.base_tool.Nope")
    assert get_tool_class("verl.tools.base_tool.BaseTool") is BaseTool  # verl's path reads as ours


def test_load_all_tools_with_mcp_native_and_function_tools_in_one_run(native_yaml, tmp_path):
    """One tool YAML with a native tool and an MCP server (``type: mcp``), plus a function-tool file."""
    pytest.importorskip("mcp", reason="needs the 'mcp' extra (pip install 'hybridflow[mcp]')")
    import json
    import os
    import sys
    from pathlib import Path

    from hybridflow.tools.utils.mcp_client import close_all_managers

    server = Path(__file__).resolve().parents[1] / "tools" / "mcp_calc_server.py"
    (tmp_path / "mcp_servers.json").write_text(json.dumps({"mcpServers": {"calc": {
        "command": sys.executable, "args": [str(server)],
        "env": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}}}))
    with open(native_yaml, "a") as f:
        f.write("  - class_name: verl.tools.mcp_base_tool.MCPBaseTool\n"
                "    config: {type: mcp, timeout: 5}\n"
                "    mcp: {mcp_servers_config_path: mcp_servers.json, tool_selected_list: [add]}\n")
    try:
        tools = load_all_tools(native_yaml, write(tmp_path, TWO_TOOLS))
        assert [t.name for t in tools] == ["search", "add", "calculator", "get_weather"]  # file tools by name
        out = asyncio.run(ToolExecutor(tools, timeout_s=20).call("add", {"a": 2, "b": 40}))
        assert out.ok and out.text.strip() == "42"
    finally:
        close_all_managers()
