"""The tool interface used by multi-turn agent loops (same surface as verl's ``BaseTool``).

A tool object is shared by every trajectory of a rollout; per-trajectory state lives in an *instance* created
with :meth:`BaseTool.create` (e.g. the ground truth of the sample being solved) and dropped by
:meth:`BaseTool.release`. :meth:`BaseTool.execute` answers one call with ``(ToolResponse, step_reward,
metrics)``. All methods are async so slow tools (sandbox, retrieval) overlap across trajectories.

Rollouts must survive whatever the policy writes: :func:`safe_execute` parses and validates raw call
arguments against the tool schema and turns any failure - bad JSON, wrong types, a tool that raises - into an
error *text* for the model, never an exception that would kill the rollout.
"""

from __future__ import annotations

import dataclasses
import traceback
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
    """Base class of every tool. Subclasses set ``default_schema`` and override :meth:`execute`.

    ``config`` is the tool's ``config:`` mapping from the tool YAML; subclasses turn it into a typed dataclass
    with :func:`parse_tool_config`. ``tool_schema`` overrides ``default_schema`` (the YAML's ``tool_schema``).
    """

    default_schema: ClassVar[dict | None] = None

    def __init__(self, config: dict | None = None, tool_schema: OpenAIFunctionToolSchema | dict | None = None):
        self.config = dict(config or {})
        schema = tool_schema if tool_schema is not None else self.default_schema
        if schema is None:
            raise ValueError(
                f"{type(self).__name__} needs a tool_schema: give 'tool_schema: {{type: function, function: "
                "{name, description, parameters}}' in the tool config or set default_schema on the class"
            )
        if isinstance(schema, dict):
            schema = OpenAIFunctionToolSchema.model_validate(schema)
        self.tool_schema: OpenAIFunctionToolSchema = schema
        self.name: str = schema.function.name
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> str:
        """Start a per-trajectory instance; ``kwargs`` are the sample's ``tools_kwargs[name].create_kwargs``."""
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = {"create_kwargs": kwargs, "reward": 0.0}
        return instance_id

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> ExecuteResult:
        raise NotImplementedError(f"{type(self).__name__} must implement execute(instance_id, parameters)")

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """Trajectory-level reward contributed by this tool (0 unless the tool scores answers)."""
        return float(self._instance(instance_id)["reward"])

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


def error_result(message: str) -> ExecuteResult:
    """A failed call as the model should see it: an error text, zero reward, and an ``error`` metric."""
    return ToolResponse(text=f"Error: {message}"), 0.0, {"error": 1.0}


async def safe_execute(tool: BaseTool, instance_id: str, raw_arguments: str | dict | None, **kwargs) -> ExecuteResult:
    """Execute a model-issued call without ever raising: malformed input and tool crashes become error text."""
    args, bad = tool.check_arguments(raw_arguments)
    if bad is not None:
        return bad
    try:
        response, reward, metrics = await tool.execute(instance_id, args, **kwargs)
    except Exception as e:  # the rollout must go on; the model sees what went wrong
        last = traceback.format_exception_only(type(e), e)[-1].strip()
        return error_result(f"{tool.name} failed: {last}")
    if not isinstance(response, ToolResponse):
        response = ToolResponse(text=str(response))
    return response, float(reward), dict(metrics or {})


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
    "safe_execute",
    "error_result",
    "parse_tool_config",
]
