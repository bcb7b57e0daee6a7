"""``@function_tool``: a typed, documented Python function becomes a tool.

    # my_tools.py
    from hybridflow.tools import function_tool

    @function_tool
    def multiply(a: int, b: int) -> int:
        \"\"\"Multiply two integers exactly.

        Args:
            a: the first factor
            b: the second factor
        \"\"\"
        return a * b

    # tool_config.yaml
    tools:
      - class_name: my_tools.multiply
        config: {type: native}

The decorator returns a :class:`~hybridflow.tools.base_tool.BaseTool` subclass (so the tool YAML can name it);
the original function stays reachable as ``multiply.fn``. The OpenAI schema comes from the type hints and the
Google-style docstring through ``transformers.utils.get_json_schema`` (the schema chat templates render), so a
missing hint or an undocumented argument is an error at decoration time. ``tool_schema`` in the YAML, when
given, replaces it.

Sync functions run in a worker thread (a slow one cannot stall the agent loop's event loop, and the executor's
timeout applies); ``async def`` functions are awaited. The return value becomes the observation: a
``ToolResponse`` or a ``(ToolResponse, step_reward, metrics)`` tuple is passed through, a ``str`` is the text,
anything else is JSON-encoded. A function that declares ``**kwargs`` also receives the sample's
``create_kwargs`` and ``execute_kwargs`` (e.g. a ground truth) besides the model's arguments.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from typing import Any, Callable

from hybridflow.tools.base_tool import BaseTool
from hybridflow.tools.schemas import ToolResponse


def function_schema(fn: Callable) -> dict:
    """The OpenAI function schema of ``fn`` (``**kwargs`` is not part of it)."""
    from transformers.utils import get_json_schema

    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]

    @functools.wraps(fn)
    def shim(*args, **kwargs):  # only its signature is read
        raise NotImplementedError

    shim.__signature__ = signature.replace(parameters=params)
    try:
        schema = get_json_schema(shim)
    except Exception as e:  # transformers' TypeHintParsingException / DocstringParsingException
        raise TypeError(f"@function_tool {fn.__qualname__}: {e}. Every argument needs a type hint and a line in "
                        "the docstring's 'Args:' section, and the docstring needs a description") from e
    schema["function"].pop("return", None)
    return schema


def _as_result(value: Any) -> Any:
    if isinstance(value, (ToolResponse, tuple)):
        return value  # checked by the executor
    if isinstance(value, str):
        return ToolResponse(text=value), 0.0, {}
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = str(value)
    return ToolResponse(text=text), 0.0, {}


class FunctionTool(BaseTool):
    """Base of the classes :func:`function_tool` makes; ``fn`` is the wrapped function."""

    fn: Callable[..., Any]
    passes_kwargs: bool = False

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> Any:
        call_kwargs = dict(parameters)
        if self.passes_kwargs:
            state = self._instances.get(instance_id, {})
            extra = {**state.get("create_kwargs", {}), **kwargs}
            call_kwargs = {**extra, **call_kwargs}
        fn = type(self).fn
        if inspect.iscoroutinefunction(fn):
            value = await fn(**call_kwargs)
        else:
            value = await asyncio.to_thread(functools.partial(fn, **call_kwargs))
        return _as_result(value)


def function_tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Decorator (bare or with ``name=``/``description=``) turning ``fn`` into a :class:`FunctionTool` class."""

    def wrap(func: Callable) -> type[FunctionTool]:
        schema = function_schema(func)
        if name is not None:
            schema["function"]["name"] = name
        if description is not None:
            schema["function"]["description"] = description
        passes = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(func).parameters.values())
        cls = type(func.__name__, (FunctionTool,), {
            "fn": staticmethod(func),
            "default_schema": schema,
            "passes_kwargs": passes,
            "__doc__": func.__doc__,
            "__module__": func.__module__,
            "__qualname__": func.__qualname__,
        })
        return cls

    return wrap(fn) if fn is not None else wrap


__all__ = ["FunctionTool", "function_schema", "function_tool"]
