"""A model's tool call with malformed JSON arguments becomes an error message for the conversation (so the
agent loop can answer the model and go on), never an exception that ends the rollout."""

from __future__ import annotations

import pytest

from hybridflow.tools.schemas import OpenAIFunctionCallSchema


@pytest.mark.parametrize("raw,needle", [
    ('{"expression": "1+1"', "not valid JSON"),            # truncated mid-object (max_response_length hit)
    ("{'expression': '1+1'}", "not valid JSON"),           # Python repr instead of JSON
    ('["1+1"]', "must be a JSON object"),                  # valid JSON, wrong shape
    (42, "must be a JSON object, got int"),                # not text at all
])
def test_malformed_tool_arguments_become_an_error_for_the_model(raw, needle):
    call, error = OpenAIFunctionCallSchema.from_raw("calculator", raw)
    assert call.name == "calculator" and call.arguments == {}
    assert error is not None and needle in error


def test_error_points_at_the_bad_position():
    _, error = OpenAIFunctionCallSchema.from_raw("calculator", '{"expression": 1+1}')
    assert "at position 16" in error and "1+1" in error


def test_well_formed_arguments_pass_through():
    call, error = OpenAIFunctionCallSchema.from_raw("calculator", '{"expression": "2*3"}')
    assert error is None and call.arguments == {"expression": "2*3"}
