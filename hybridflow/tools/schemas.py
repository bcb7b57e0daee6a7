"""Tool schemas in the OpenAI function-calling format, with verl's class names.

verl users write tool-config YAML with ``tool_schema: {type: function, function: {name, description,
parameters}}`` and tool classes that return ``ToolResponse``; keeping the same pydantic models (and names)
lets their YAML and tool code load unchanged. ``parameters`` is the JSON-Schema subset that chat templates
render (object with typed properties, ``required``, ``enum``); :func:`validate_arguments` checks a model's
call against it so a malformed call becomes an error message for the model instead of an exception.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OpenAIFunctionPropertySchema(BaseModel):
    """One argument: JSON-Schema ``type`` (e.g. string, number, integer, boolean, array, object).

    Other JSON-Schema keywords (``nullable``, ``default``, ``properties`` of a nested object, ...) are kept as
    written, so the schema a chat template renders is the one the user gave (or ``get_json_schema`` produced).
    """

    model_config = ConfigDict(extra="allow")

    type: str | list[str] | None = None
    description: str | None = None
    enum: list[Any] | None = None
    items: dict[str, Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    type: Literal["object"] = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """``{"type": "function", "function": {...}}`` — what goes into ``apply_chat_template(tools=[...])``."""

    type: Literal["function"] = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as a parser extracts it: the name and the arguments as the model wrote them (JSON text)."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call parsed from model output: the function name and its arguments (already a dict)."""

    name: str
    arguments: dict[str, Any]

    @classmethod
    def from_raw(cls, name: str, arguments: str | dict) -> tuple["OpenAIFunctionCallSchema", str | None]:
        """Parse ``arguments`` (JSON text or dict); returns the call and an error message (None when fine).

        Bad JSON gives empty arguments plus the error, so the caller can answer the model instead of raising.
        """
        parsed, error = parse_arguments(arguments)
        return cls(name=name, arguments=parsed if parsed is not None else {}), error

    @staticmethod
    def from_openai_function_parsed_schema(
        parsed_schema: OpenAIFunctionParsedSchema,
    ) -> tuple["OpenAIFunctionCallSchema", bool]:
        """verl's spelling: ``(call, has_decode_error)``; arguments that are not a JSON object become ``{}``."""
        call, error = OpenAIFunctionCallSchema.from_raw(parsed_schema.name, parsed_schema.arguments)
        return call, error is not None


class OpenAIFunctionToolCall(BaseModel):
    """A tool call in an assistant message (OpenAI chat format)."""

    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool returns to the conversation: text and/or images/videos (multimodal tools).

    ``image`` and ``video`` are lists (one item per picture/clip); a single image must be wrapped: ``[img]``.
    """

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _media_are_lists(cls, values):
        if isinstance(values, dict):
            for key in ("image", "video"):
                if values.get(key) is not None and not isinstance(values[key], list):
                    raise ValueError(f"ToolResponse.{key} must be a list, got {type(values[key]).__name__}; "
                                     f"wrap a single item: {key}=[item]")
        return values

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video


def parse_arguments(arguments: str | dict | None) -> tuple[dict | None, str | None]:
    """Turn a tool call's ``arguments`` into a dict; (None, message) when it is not a JSON object."""
    if arguments is None:
        return {}, None
    if isinstance(arguments, dict):
        return arguments, None
    if not isinstance(arguments, str):
        return None, f"tool arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as e:
        return None, f"tool arguments are not valid JSON ({e.msg} at position {e.pos}): {arguments[:200]!r}"
    if not isinstance(value, dict):
        return None, f"tool arguments must be a JSON object like {{\"name\": value}}, got {type(value).__name__}"
    return value, None


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        types = _JSON_TYPES.get(name)
        if types is None:
            return True  # a type we do not model: do not reject the call
        if isinstance(value, bool) and name in ("number", "integer"):
            continue  # JSON booleans are not numbers, although Python says bool is an int
        if isinstance(value, types):
            return True
    return False


def validate_arguments(schema: OpenAIFunctionToolSchema, arguments: dict) -> str | None:
    """Check ``arguments`` against the tool's parameter schema; returns an error message or None."""
    params = schema.function.parameters
    name = schema.function.name
    missing = [k for k in params.required if k not in arguments]
    if missing:
        return f"{name}: missing required argument(s) {missing}; expected {sorted(params.properties)}"
    unknown = [k for k in arguments if k not in params.properties]
    if unknown:
        return f"{name}: unknown argument(s) {unknown}; expected {sorted(params.properties)}"
    for key, value in arguments.items():
        prop = params.properties[key]
        if value is None and (prop.model_extra or {}).get("nullable"):
            continue
        if prop.type is not None and not _type_ok(value, prop.type):
            return f"{name}: argument '{key}' must be of type {prop.type}, got {type(value).__name__} {value!r:.80}"
        if prop.enum is not None and value not in prop.enum:
            return f"{name}: argument '{key}' must be one of {prop.enum}, got {value!r:.80}"
        if prop.items is not None and "type" in prop.items and isinstance(value, (list, tuple)):
            bad = [v for v in value if not _type_ok(v, prop.items["type"])]
            if bad:
                return f"{name}: every item of '{key}' must be of type {prop.items['type']}, got {bad[0]!r:.80}"
    return None


__all__ = [
    "OpenAIFunctionPropertySchema",
    "OpenAIFunctionParametersSchema",
    "OpenAIFunctionSchema",
    "OpenAIFunctionToolSchema",
    "OpenAIFunctionParsedSchema",
    "OpenAIFunctionCallSchema",
    "OpenAIFunctionToolCall",
    "ToolResponse",
    "parse_arguments",
    "validate_arguments",
]
