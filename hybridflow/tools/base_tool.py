"""The tool interface used by multi-turn agent loops (verl's ``BaseTool``, same signatures).

A tool object is shared by every trajectory of a rollout; per-trajectory state lives in an *instance* created
with :meth:`BaseTool.create` (e.g. the ground truth of the sample being solved) and dropped by
:meth:`BaseTool.release`. :meth:`BaseTool.execute` answers one call with ``(ToolResponse, step_reward,
metrics)``. All methods are async so slow tools (sandbox, retrieval) overlap across trajectories.

The schema the model sees comes from, in order: the ``tool_schema`` given to the constructor (the tool YAML's
``tool_schema``), an overridden :meth:`get_openai_tool_schema` (verl's pattern with
``transformers.utils.get_json_schema``), or the class attribute ``default_schema``.

Agent loops never call these methods bare: :mod:`hybridflow.tools.executor` runs create -> execute -> release
with a timeout and turns every failure (bad JSON, wrong arguments, a tool that raises, hangs or returns
garbage) into an error observation for the model.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, ClassVar

from hybridflow.tools.schemas import OpenAIFunctionToolSchema, ToolResponse, parse_arguments, validate_arguments
from hybridflow.utils.registry import Registry, closest

ExecuteResult = tuple[ToolResponse, float, dict]

TOOL_REGISTRY: Registry[type["BaseTool"]] = Registry("tool")


def register_tool(name: str):
    """Class decorator: make a tool available by short name (``class_name: calculator`` in tool YAML)."""
    return TOOL_REGISTRY.register(name)


class BaseTool:
    """Base class of every tool. Subclasses give a schema (see the module doc) and override :meth:`execute`.

    ``config`` is the tool's ``config:`` mapping from the tool YAML; built-ins turn it into a typed dataclass
    with :func:`parse_tool_config`.
    """

    default_schema: ClassVar[dict | None] = None

    def __init__(self, config: dict | None = None, tool_schema: OpenAIFunctionToolSchema | dict | None = None):
        self.config = dict(config or {})
        self.tool_schema: OpenAIFunctionToolSchema | None = None
        schema = tool_schema if tool_schema is not None else self._schema_from_class()
        if schema is None:
            raise ValueError(
                f"{type(self).__name__} needs a tool_schema: give 'tool_schema: {{type: function, function: "
                "{name, description, parameters}}' in the tool config, set default_schema on the class or "
                "override get_openai_tool_schema()"
            )
        if isinstance(schema, dict):
            schema = OpenAIFunctionToolSchema.model_validate(schema)
        self.tool_schema = schema
        self.name: str = schema.function.name
        self._instances: dict[str, dict[str, Any]] = {}

    def _schema_from_class(self) -> OpenAIFunctionToolSchema | dict | None:
        if type(self).get_openai_tool_schema is not BaseTool.get_openai_tool_schema:
            try:
                return self.get_openai_tool_schema()
            except AttributeError:  # an override that returns self.tool_schema, as verl's built-ins do
                pass
        return self.default_schema

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        """Start a per-trajectory instance; returns ``(instance_id, creation response)`` as verl does.

        ``kwargs`` are the sample's ``tools_kwargs[name].create_kwargs``, given either spread out or as one
        ``create_kwargs=`` mapping (verl's agent loop passes the latter); both land in the instance's
        ``create_kwargs``.
        """
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = {"create_kwargs": merge_create_kwargs(kwargs), "reward": 0.0}
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> ExecuteResult:
        raise NotImplementedError(f"{type(self).__name__} must implement execute(instance_id, parameters)")

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """Trajectory-level reward contributed by this tool (0 unless the tool scores answers)."""
        return float(self._instances.get(instance_id, {}).get("reward", 0.0))

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)

    def _instance(self, instance_id: str) -> dict[str, Any]:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise KeyError(
                f"{self.name}: unknown instance_id {instance_id!r}; call create() before execute()/calc_reward()"
            ) from None

    def coerce_arguments(self, arguments: dict) -> dict:
        """Hook for harmless repairs before validation (e.g. a number where the schema says string)."""
        return arguments

    def check_arguments(self, parameters: Any) -> tuple[dict | None, ExecuteResult | None]:
        """(arguments, None) when ``parameters`` fit the schema, else (None, an error result for the model)."""
        args, error = parse_arguments(parameters)
        if error is None:
            args = self.coerce_arguments(args)
            error = validate_arguments(self.tool_schema, args)
        if error is not None:
            return None, error_result(f"{self.name}: {error}" if not error.startswith(self.name) else error)
        return args, None


def merge_create_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``create(create_kwargs={...}, **rest)`` -> one flat mapping (explicit keywords win)."""
    nested = kwargs.get("create_kwargs")
    flat = {k: v for k, v in kwargs.items() if k != "create_kwargs"}
    return {**nested, **flat} if isinstance(nested, dict) else flat


def error_result(message: str) -> ExecuteResult:
    """A failed call as the model should see it: an error text, zero reward, and an ``error`` metric."""
    return ToolResponse(text=f"Error: {message}"), 0.0, {"error": 1.0}


def parse_tool_config(cls: type, config: dict | None, tool_name: str):
    """Build the typed config dataclass ``cls`` from a YAML mapping; unknown keys are an error naming the fix.

    ``type`` (native/mcp in verl's YAML) is accepted and ignored here: the loader dispatches on it.
    """
    values = {k: v for k, v in (config or {}).items() if k != "type"}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        hints = [f"'{k}'" + (f" (did you mean '{closest(k, sorted(known))}'?)" if closest(k, sorted(known)) else "")
                 for k in unknown]
        raise ValueError(f"tool '{tool_name}': unknown config key(s) {', '.join(hints)}; known keys: {sorted(known)}")
    return cls(**values)


__all__ = [
    "BaseTool",
    "ExecuteResult",
    "TOOL_REGISTRY",
    "register_tool",
    "error_result",
    "merge_create_kwargs",
    "parse_tool_config",
]
