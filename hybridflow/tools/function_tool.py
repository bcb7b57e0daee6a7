"""``@function_tool``: a typed, documented Python function becomes a tool (verl's ``verl.tools.function_tool``).

    # my_tools.py
    from hybridflow.tools.function_tool import function_tool

    @function_tool                      # or @function_tool("multiply") to choose the tool's name
    def multiply(a: int, b: int) -> int:
        \"\"\"Multiply two integers exactly.

        Args:
            a: the first factor
            b: the second factor
        \"\"\"
        return a * b

The decorator returns the function unchanged and registers a :class:`FunctionTool` (name, function, OpenAI
schema) in ``FUNCTION_TOOL_REGISTRY``. Such tools reach a run in two ways: verl's
``rollout.multi_turn.function_tool_path: my_tools.py`` (:func:`load_function_tools_from_path` runs the file
and returns the tools it registered), or hybridflow's tool YAML entry ``class_name: my_tools.multiply``
(the registered function is wrapped in a :class:`~hybridflow.tools.base_tool.BaseTool`).

The schema comes from the type hints and the Google-style docstring through
``transformers.utils.get_json_schema`` (what chat templates render), so a missing hint or an undocumented
argument is an error at decoration time; ``schema=`` (a dict or ``OpenAIFunctionToolSchema``) replaces it.
Sync functions run in a worker thread (a slow one cannot stall the agent loop, and the executor's timeout
applies); ``async def`` functions are awaited. :func:`normalize_function_tool_return` turns the return value
into ``(ToolResponse, reward, metrics)`` as verl does. Beyond verl: ``description=`` overrides the docstring's
summary, and a function that declares an untyped ``**kwargs`` (verl refuses every ``**kwargs``) also receives the
sample's ``create_kwargs`` and ``execute_kwargs`` (e.g. a ground truth) besides the model's arguments. ``*args`` and
a typed ``**kwargs: T`` (variadic model arguments) are refused at registration, as in verl.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import logging
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)

FUNCTION_TOOL_REGISTRY: dict[str, "FunctionTool"] = {}
_LOADED_FUNCTION_TOOL_PATHS: dict[str, list["FunctionTool"]] = {}


@dataclass
class FunctionTool:
    """What :func:`function_tool` registers: ``name``, the function ``fn``, its ``tool_schema``, and whether
    it is a coroutine function. Not a ``BaseTool`` (agent loops dispatch on the difference, as verl's)."""

    name: str
    fn: Callable[..., Any]
    tool_schema: OpenAIFunctionToolSchema
    is_async: bool = False
    passes_kwargs: bool = False  # the function declares **kwargs: it also gets create/execute kwargs

    async def call(self, parameters: dict[str, Any]) -> Any:
        """The function's raw return value for the model's arguments (a thread for sync functions)."""
        if self.is_async:
            return await self.fn(**parameters)
        return await asyncio.to_thread(functools.partial(self.fn, **parameters))


def function_schema(fn: Callable, tool_name: str | None = None) -> dict:
    """The OpenAI function schema of ``fn`` (``**kwargs`` is not part of it; ``*args`` is refused)."""
    from transformers.utils import get_json_schema

    signature = inspect.signature(fn)
    # *args, and a typed **kwargs (``**kwargs: int``: arguments for the model), are variadic model arguments, which
    # a schema of fixed properties cannot express; an untyped ``**kwargs`` (or ``**kwargs: Any``) is hybridflow's
    # channel for the sample's create/execute kwargs and stays out of the schema.
    variadic = [f"{'**' if p.kind is inspect.Parameter.VAR_KEYWORD else '*'}{n}" for n, p in signature.parameters.items()
                if p.kind is inspect.Parameter.VAR_POSITIONAL
                or (p.kind is inspect.Parameter.VAR_KEYWORD and p.annotation not in (inspect.Parameter.empty, Any))]
    if variadic:
        raise ValueError(f"@function_tool {fn.__qualname__} declares variadic parameter(s) {variadic}, which an "
                         "OpenAI tool schema cannot express: take a named parameter such as 'values: list[int]' "
                         "(an untyped **kwargs receives the sample's create/execute kwargs, not model arguments)")
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    context = {n for n, p in signature.parameters.items() if p.kind is inspect.Parameter.VAR_KEYWORD}

    @functools.wraps(fn)
    def shim(*args, **kwargs):  # only its signature and annotations are read
        raise NotImplementedError

    shim.__signature__ = signature.replace(parameters=params)
    shim.__annotations__ = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k not in context}
    try:
        schema = get_json_schema(shim)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        raise TypeError(f"@function_tool {fn.__qualname__}: {e}. Every argument needs a type hint and a line in "
                        "the docstring's 'Args:' section, and the docstring needs a description") from e
    schema["function"].pop("return", None)
    if tool_name is not None:
        schema["function"]["name"] = tool_name
    return schema


def function_tool(name: Optional[str | Callable] = None, *, schema: OpenAIFunctionToolSchema | dict | None = None,
                  description: str | None = None):
    """Register a function as a tool: ``@function_tool``, ``@function_tool()``, ``@function_tool("name")``,
    ``@function_tool(name=..., schema=..., description=...)``. Returns the function unchanged.

    A second function registered under a name already taken raises ``ValueError`` (re-decorating the same
    function is fine)."""

    def decorator(fn: Callable) -> Callable:
        tool_name = tool_name_override or fn.__name__
        if isinstance(schema, OpenAIFunctionToolSchema):
            built = schema
        elif isinstance(schema, dict):
            built = OpenAIFunctionToolSchema.model_validate(schema)
        else:
            raw = function_schema(fn, tool_name)
            if description is not None:
                raw["function"]["description"] = description
            built = OpenAIFunctionToolSchema.model_validate(raw)
        passes = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
        entry = FunctionTool(name=tool_name, fn=fn, tool_schema=built, is_async=inspect.iscoroutinefunction(fn),
                             passes_kwargs=passes)
        existing = FUNCTION_TOOL_REGISTRY.get(tool_name)
        if existing is not None and existing.fn is not fn:
            raise ValueError(f"Function tool '{tool_name}' is already registered to {existing.fn.__module__}."
                             f"{existing.fn.__qualname__}; refusing to overwrite with {fn.__module__}.{fn.__qualname__}"
                             ". Give one of them another name: @function_tool(\"other_name\")")
        FUNCTION_TOOL_REGISTRY[tool_name] = entry
        return fn

    if callable(name) and schema is None and description is None:  # bare @function_tool
        tool_name_override = None
        return decorator(name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"@function_tool(name) expects a string name, got {type(name).__name__}")
    tool_name_override = name
    return decorator


def get_function_tool(name: str) -> FunctionTool:
    """The registered tool ``name``; ``KeyError`` naming where tools come from otherwise."""
    if name not in FUNCTION_TOOL_REGISTRY:
        raise KeyError(f"Function tool '{name}' not found in registry (registered: {sorted(FUNCTION_TOOL_REGISTRY)}). "
                       "Make sure its defining file is referenced via the rollout `function_tool_path` config.")
    return FUNCTION_TOOL_REGISTRY[name]


def registered_function_tool(obj: Any) -> FunctionTool | None:
    """The registry entry of a decorated function (``None`` when ``obj`` was not registered)."""
    return next((t for t in FUNCTION_TOOL_REGISTRY.values() if t.fn is obj), None)


def load_function_tools_from_path(path: str | os.PathLike) -> list[FunctionTool]:
    """Run the Python file at ``path`` and return the tools it registered (once per file and process: a
    second call returns the same objects)."""
    abs_path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"function_tool_path does not exist: {path} "
                                "(actor_rollout_ref.rollout.multi_turn.function_tool_path)")
    if abs_path in _LOADED_FUNCTION_TOOL_PATHS:
        return _LOADED_FUNCTION_TOOL_PATHS[abs_path]
    before = set(FUNCTION_TOOL_REGISTRY)
    module_name = "_function_tools_" + abs_path.replace(os.sep, "_").replace(".", "_")
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"function_tool_path {path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so the file's own imports of itself / siblings resolve
    spec.loader.exec_module(module)
    new_names = sorted(set(FUNCTION_TOOL_REGISTRY) - before)
    if not new_names:
        logger.warning("function_tool_path '%s' loaded but no @function_tool decorators found; did you forget to "
                       "apply the decorator?", path)
    tools = [FUNCTION_TOOL_REGISTRY[n] for n in new_names]
    _LOADED_FUNCTION_TOOL_PATHS[abs_path] = tools
    return tools


def _as_response(value: Any) -> ToolResponse:
    if isinstance(value, ToolResponse):
        return value
    if isinstance(value, str):
        return ToolResponse(text=value)
    if isinstance(value, dict):
        return ToolResponse(text=json.dumps(value, ensure_ascii=False))
    return ToolResponse(text=str(value))


def normalize_function_tool_return(ret: Any) -> tuple[ToolResponse, float, dict]:
    """A function's return value as ``(ToolResponse, reward, metrics)``: a ``ToolResponse`` or ``str`` is the
    response, a ``dict`` is JSON text, a 1-3 tuple is ``(response, reward, metrics)`` (``None`` reward -> 0.0,
    ``None`` metrics -> {}), anything else its ``str``. A tuple of another length raises ``TypeError``."""
    if isinstance(ret, tuple):
        if not 1 <= len(ret) <= 3:
            raise TypeError(f"@function_tool return tuple must have length 1, 2, or 3 (got length {len(ret)}: "
                            f"{ret!r:.200}). Use (response,), (response, reward), or (response, reward, metrics).")
        reward = 0.0 if len(ret) < 2 or ret[1] is None else float(ret[1])
        metrics = {} if len(ret) < 3 or ret[2] is None else dict(ret[2])
        return _as_response(ret[0]), reward, metrics
    return _as_response(ret), 0.0, {}


class FunctionToolAdapter(BaseTool):
    """A registered :class:`FunctionTool` as a ``BaseTool``, for the executor and the tool YAML."""

    def __init__(self, tool: FunctionTool, config: dict | None = None, tool_schema=None):
        self.function_tool = tool
        super().__init__(config=dict(config or {}), tool_schema=tool_schema or tool.tool_schema)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> Any:
        call_kwargs = dict(parameters)
        if self.function_tool.passes_kwargs:
            state = self._instances.get(instance_id, {})
            call_kwargs = {**state.get("create_kwargs", {}), **kwargs, **call_kwargs}
        value = await self.function_tool.call(call_kwargs)
        try:
            return normalize_function_tool_return(value)
        except TypeError:
            return value  # the executor reports a malformed return as 'bad_return'


def adapter_class(tool: FunctionTool) -> type[FunctionToolAdapter]:
    """A ``BaseTool`` class for ``tool`` (what the tool YAML's ``class_name`` resolves to): constructed as
    ``cls(config=..., tool_schema=...)`` like any tool class."""

    def __init__(self, config: dict | None = None, tool_schema=None):
        FunctionToolAdapter.__init__(self, tool, config, tool_schema)

    return type(tool.name, (FunctionToolAdapter,), {"__init__": __init__, "__doc__": tool.fn.__doc__,
                                                     "__module__": tool.fn.__module__})


def as_base_tool(tool: Any) -> BaseTool:
    """``tool`` itself when it is a ``BaseTool``; a registered function tool wrapped in one."""
    if isinstance(tool, BaseTool):
        return tool
    if isinstance(tool, FunctionTool):
        return FunctionToolAdapter(tool)
    raise TypeError(f"expected a BaseTool or a FunctionTool (from @function_tool), got {type(tool).__name__}")


__all__ = [
    "FUNCTION_TOOL_REGISTRY",
    "FunctionTool",
    "FunctionToolAdapter",
    "adapter_class",
    "as_base_tool",
    "function_schema",
    "function_tool",
    "get_function_tool",
    "load_function_tools_from_path",
    "normalize_function_tool_return",
    "registered_function_tool",
]


class _CallableModule(types.ModuleType):
    """This module, callable as the decorator. ``hybridflow.tools.function_tool`` must be the module (verl's
    ``from verl.tools import function_tool`` names the module, and ``import ....function_tool as m`` resolves
    through the package attribute), while ``from hybridflow.tools import function_tool`` followed by
    ``@function_tool`` is hybridflow's documented spelling: calling the module calls :func:`function_tool`."""

    def __call__(self, *args, **kwargs):
        return function_tool(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
