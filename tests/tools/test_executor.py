"""The tool executor: every call ends in an observation; errors are classified and counted; truncation as verl."""

from __future__ import annotations

import asyncio
import time

import pytest

from hybridflow.tools import BaseTool, CalculatorTool, Gsm8kTool, ToolExecutor, ToolResponse, summarize_outcomes
from hybridflow.tools.executor import truncate_tool_response

SCHEMA = {"type": "function", "function": {"name": "probe", "description": "records its calls", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}, "mode": {"type": "string", "enum": ["ok", "raise",
    "hang", "block", "tuple2", "str", "badreward", "nanreward", "nones", "metrics", "long", "bare"]}},
    "required": ["x"]}}}


class Probe(BaseTool):
    """Records every method call with its keyword arguments; ``mode`` picks a misbehaviour."""

    default_schema = SCHEMA

    def __init__(self, config=None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.log: list[tuple[str, dict]] = []

    async def create(self, instance_id=None, **kwargs):
        self.log.append(("create", kwargs))
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, parameters, **kwargs):
        self.log.append(("execute", kwargs))
        mode = parameters.get("mode", "ok")
        self._instances[instance_id]["reward"] += parameters["x"]
        if mode == "raise":
            raise ValueError("probe exploded")
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "block":
            time.sleep(0.01)
        returns = {"tuple2": (ToolResponse(text="a"), 1.0), "str": "just text", "badreward": (ToolResponse(), "1", {}),
                   "nanreward": (ToolResponse(), float("nan"), {}), "nones": (ToolResponse(text="n"), None, None),
                   "metrics": (ToolResponse(text="m"), 0.5, [1]), "long": (ToolResponse(text="0123456789" * 3), 0.0, {}),
                   "bare": ToolResponse(text="bare")}
        return returns.get(mode, (ToolResponse(text=f"x={parameters['x']}"), 0.25, {"seen": 1.0}))

    async def calc_reward(self, instance_id, **kwargs):
        self.log.append(("calc_reward", kwargs))
        return await super().calc_reward(instance_id)

    async def release(self, instance_id, **kwargs):
        self.log.append(("release", kwargs))
        await super().release(instance_id)


def run(coro):
    return asyncio.run(coro)


def test_success_runs_create_execute_calc_reward_release_with_each_kwargs():
    probe = Probe()
    ex = ToolExecutor([probe])
    kwargs = {"probe": {"create_kwargs": {"ground_truth": "7"}, "execute_kwargs": {"e": 1},
                        "calc_reward_kwargs": {"c": 2}, "release_kwargs": {"r": 3}}}
    out = run(ex.call("probe", '{"x": 4}', kwargs, agent_data="AD"))
    assert out.ok and out.text == "x=4" and out.step_reward == 0.25 and out.metrics == {"seen": 1.0}
    assert out.tool_reward == 4.0
    names = [n for n, _ in probe.log]
    assert names == ["create", "execute", "calc_reward", "release"]
    create_kwargs = probe.log[0][1]  # both spellings verl tools read
    assert create_kwargs == {"create_kwargs": {"ground_truth": "7"}, "ground_truth": "7"}
    assert probe.log[1][1] == {"e": 1, "agent_data": "AD"}
    assert probe.log[2][1] == {"c": 2} and probe.log[3][1] == {"r": 3}
    assert probe._instances == {}


@pytest.mark.parametrize("name, arguments, kind, needle", [
    ("nope", '{"x": 1}', "unknown_tool", "unknown tool 'nope'; available tools: calculator, probe"),
    ("probe", '{"x": 1', "invalid_json", "not valid JSON"),
    ("probe", '[1, 2]', "invalid_json", "must be a JSON object"),
    ("probe", '{"y": 1}', "invalid_arguments", "missing required argument(s) ['x']"),
    ("probe", '{"x": "1"}', "invalid_arguments", "'x' must be of type integer"),
    ("probe", '{"x": 1, "mode": "fast"}', "invalid_arguments", "must be one of"),
    ("probe", '{"x": 1, "z": 0}', "invalid_arguments", "unknown argument(s) ['z']"),
    ("probe", '{"x": 1, "mode": "raise"}', "tool_exception", "probe failed: ValueError: probe exploded"),
    ("probe", '{"x": 1, "mode": "tuple2"}', "bad_return", "a tuple of length 2"),
    ("probe", '{"x": 1, "mode": "badreward"}', "bad_return", "step_reward '1'"),
    ("probe", '{"x": 1, "mode": "nanreward"}', "bad_return", "finite number"),
    ("probe", '{"x": 1, "mode": "metrics"}', "bad_return", "metrics of type list"),
])
def test_failures_become_observations_with_a_kind(name, arguments, kind, needle):
    probe = Probe()
    ex = ToolExecutor([probe, CalculatorTool()], max_tool_response_length=1000)
    out = run(ex.call(name, arguments))
    assert not out.ok and out.error_kind == kind
    assert out.text.startswith("Error: ") and needle in out.text, out.text
    assert out.step_reward == 0.0 and out.tool_reward is None
    assert ex.stats["tool_calls"] == 1 and ex.stats["tool_errors"] == 1 and ex.stats[f"tool_errors/{kind}"] == 1
    assert probe._instances == {}  # whatever happened, the instance was released
    rejected_before_running = kind in ("unknown_tool", "invalid_json", "invalid_arguments")
    expected = [] if rejected_before_running else ["create", "execute", "calc_reward", "release"]
    assert [n for n, _ in probe.log] == expected


def test_hanging_tool_times_out_and_is_released():
    probe = Probe()
    ex = ToolExecutor([probe], timeout_s=0.2)
    start = time.monotonic()
    out = run(ex.call("probe", {"x": 1, "mode": "hang"}))
    assert out.error_kind == "timeout" and "did not answer within 0.2 s" in out.text
    assert time.monotonic() - start < 5
    assert [n for n, _ in probe.log][-1] == "release" and probe._instances == {}


def test_lenient_returns_are_accepted():
    ex = ToolExecutor([Probe()])
    nones = run(ex.call("probe", {"x": 1, "mode": "nones"}))  # verl's SandboxFusionTool returns (resp, None, None)
    assert nones.ok and (nones.text, nones.step_reward, nones.metrics) == ("n", 0.0, {})
    bare = run(ex.call("probe", {"x": 1, "mode": "bare"}))
    assert bare.ok and bare.text == "bare"


def test_str_return_is_garbage_not_text():
    # a bare string (not in a tuple) is not a ToolResponse: the model is told, and it is counted
    ex = ToolExecutor([Probe()])
    out = run(ex.call("probe", {"x": 1, "mode": "str"}))
    assert out.error_kind == "bad_return" and "returned str" in out.text


@pytest.mark.parametrize("side, expected", [
    ("left", "01234567...(truncated)"),
    ("right", "(truncated)...23456789"),
    ("middle", "0123...(truncated)...6789"),
])
def test_truncation_follows_verl(side, expected):
    assert truncate_tool_response("0123456789" * 3, 8, side) == expected
    assert truncate_tool_response("short", 8, side) == "short"
    ex = ToolExecutor([Probe()], max_tool_response_length=8, tool_response_truncate_side=side)
    out = run(ex.call("probe", {"x": 1, "mode": "long"}))
    assert out.ok and out.truncated and out.text == expected


def test_bad_executor_settings_are_refused():
    with pytest.raises(ValueError, match="tool_response_truncate_side='top'"):
        ToolExecutor([], tool_response_truncate_side="top")
    with pytest.raises(ValueError, match="max_tool_response_length must be >= 1"):
        ToolExecutor([], max_tool_response_length=0)
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        ToolExecutor([], timeout_s=0)


def test_session_keeps_one_instance_per_tool_across_calls():
    tool = Gsm8kTool()
    ex = ToolExecutor([tool])

    async def go():
        session = ex.session({"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "12"}}})
        first = await session.call("calc_gsm8k_reward", {"answer": "11"})
        second = await session.call("calc_gsm8k_reward", {"answer": "12"})
        third = await session.call("calc_gsm8k_reward", {"answer": "12"})
        bad = await session.call("calc_gsm8k_reward", '{"answer": ')
        metrics = session.metrics()
        return first, second, third, bad, await session.close(), metrics

    first, second, third, bad, rewards, metrics = run(go())
    # the instance remembers the best answer: re-submitting it is penalised (verl's shaping)
    assert [o.step_reward for o in (first, second, third)] == [-0.05, 0.0, -0.05]
    assert rewards == {"calc_gsm8k_reward": 1.0} and tool._instances == {}
    assert metrics == {"tool_calls": 4.0, "tool_errors": 1.0, "tool_errors/invalid_json": 1.0}


def test_parallel_calls_share_one_instance_created_once():
    probe = Probe()
    ex = ToolExecutor([probe])

    async def go():
        session = ex.session()
        outs = await asyncio.gather(*(session.call("probe", {"x": i}) for i in range(5)))
        rewards = await session.close()
        return outs, rewards

    outs, rewards = run(go())
    assert all(o.ok for o in outs) and rewards == {"probe": 10.0}
    assert [n for n, _ in probe.log].count("create") == 1


def test_call_many_and_parse_errors_are_counted():
    class Call:
        def __init__(self, name, arguments):
            self.name, self.arguments = name, arguments

    ex = ToolExecutor([CalculatorTool()])
    outs = run(ex.call_many([Call("calculator", '{"expression": "6*7"}'), Call("calculator", '{"expression": 1}'),
                             Call("calc", "{}")]))
    assert [o.text for o in outs[:2]] == ["42", "1"]  # a number is coerced to the expression string
    assert outs[2].error_kind == "unknown_tool"
    parse = ex.parse_error_outcome("<tool_call> 1: not valid JSON")
    assert parse.error_kind == "parse_error" and parse.text == "Error: <tool_call> 1: not valid JSON"
    assert summarize_outcomes(outs + [parse]) == {"tool_calls": 4.0, "tool_errors": 2.0,
                                                  "tool_errors/parse_error": 1.0, "tool_errors/unknown_tool": 1.0}
    assert ex.stats["tool_calls"] == 4 and ex.stats["tool_errors"] == 2


def test_blocking_sync_work_in_async_tool_still_returns():
    out = run(ToolExecutor([Probe()]).call("probe", {"x": 2, "mode": "block"}))
    assert out.ok and out.text == "x=2"


def test_a_tool_raising_timeout_error_is_an_exception_not_our_timeout():
    class Impatient(Probe):
        async def execute(self, instance_id, parameters, **kwargs):
            raise TimeoutError("upstream took too long")

    out = run(ToolExecutor([Impatient()], timeout_s=30).call("probe", {"x": 1}))
    assert out.error_kind == "tool_exception" and "TimeoutError: upstream took too long" in out.text
