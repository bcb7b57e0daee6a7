"""Built-in tools (good and malformed calls), the verl-compatible base API and schema validation."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from hybridflow.tools import (
    TOOL_REGISTRY,
    BaseTool,
    CalculatorTool,
    CodeInterpreterTool,
    Gsm8kTool,
    OpenAIFunctionCallSchema,
    SearchTool,
    ToolExecutor,
    ToolResponse,
)
from hybridflow.tools.calculator import CalculatorError, evaluate
from hybridflow.tools.gsm8k_tool import normalize_answer
from hybridflow.tools.search_tool import BM25Index


def call(tool: BaseTool, raw_args, **create_kwargs):
    """One call through the executor: ((response, step_reward, metrics), calc_reward)."""
    executor = ToolExecutor([tool], max_tool_response_length=100_000)

    async def go():
        session = executor.session({tool.name: {"create_kwargs": create_kwargs}})
        outcome = await session.call(tool.name, raw_args)
        rewards = await session.close()
        return (outcome.response, outcome.step_reward, outcome.metrics, outcome.error_kind), rewards.get(tool.name)

    (response, reward, metrics, kind), total = asyncio.run(go())
    if kind is not None:  # rejected before execute(): same shape as a tool-reported error
        metrics = {"error": 1.0}
    return (response, reward, metrics), total


def test_registry_has_the_builtins():
    assert TOOL_REGISTRY.names() == ["calc_gsm8k_reward", "calculator", "code_interpreter", "image_zoom_in_tool", "search"]


# ---- calculator -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("expression, expected", [
    ("(12 + 7) * 3 / 4", "14.25"), ("2 ** 10", "1024"), ("7 // 2", "3"), ("-7 % 3", "2"), ("0.1 + 0.2", "0.3"),
    ("sqrt(16) + abs(-2)", "6"), ("max(3, 9, 4) - min(2, 8)", "7"), ("10 / 4", "2.5"),
])
def test_calculator_values(expression, expected):
    (response, reward, metrics), _ = call(CalculatorTool(), json.dumps({"expression": expression}))
    assert response.text == expected and reward == 0.0 and metrics == {}


@pytest.mark.parametrize("expression, reason", [
    ("__import__('os').system('id')", "unsupported element"), ("9 ** 9 ** 9", "exponent"),
    ("1 / 0", "division by zero"),
    ("a + 1", "unsupported element"), ("'ab' * 3", "unsupported element"), ("(10 ** 999) ** 1000", "digits"),
    ("2 +", "not a valid expression"), ("sqrt(-1)", "sqrt()"),
])
def test_calculator_refuses_unsafe_or_bad_expressions(expression, reason):
    with pytest.raises(CalculatorError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        evaluate(expression)
    (response, _, metrics), _ = call(CalculatorTool(), {"expression": expression})
    assert response.text.startswith("Error: calculator:") and metrics == {"error": 1.0}


@pytest.mark.parametrize("raw, message", [
    ("{not json", "not valid JSON"), ('["1+1"]', "must be a JSON object"), ({"expr": "1+1"}, "missing required"),
    ({"expression": "1", "extra": 2}, "unknown argument"), ({"expression": [1]}, "must be of type string"),
    (42, "JSON object"),
])
def test_calculator_malformed_arguments_become_error_text(raw, message):
    (response, reward, metrics), _ = call(CalculatorTool(), raw)
    assert message in response.text and response.text.startswith("Error:")
    assert reward == 0.0 and metrics == {"error": 1.0}


def test_calculator_accepts_a_bare_number():
    (response, _, _), _ = call(CalculatorTool(), {"expression": 12})
    assert response.text == "12"


# ---- gsm8k -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("72", "72"), ("$1,234.00", "1234"), ("#### 18", "18"), ("The answer is 3.50.", "3.5"), ("-0", "0"),
    ("seven", "seven"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_gsm8k_tool_rewards_and_penalties():
    tool = Gsm8kTool()

    async def go():
        iid, created = await tool.create(ground_truth="1,200")
        assert created.is_empty()
        wrong = await tool.execute(iid, {"answer": "1100"})
        right = await tool.execute(iid, {"answer": "$1200"})
        again = await tool.execute(iid, {"answer": 1200})  # a number is accepted as the answer
        return wrong, right, again, await tool.calc_reward(iid)

    wrong, right, again, total = asyncio.run(go())
    assert (wrong[1], right[1], again[1], total) == (-0.05, 0.0, -0.05, 1.0)
    assert "reward=1.0" in right[0].text and "reward=0.0" in wrong[0].text
    assert right[2] == {"correct": 1.0}


def test_gsm8k_tool_create_kwargs_and_errors():
    (response, _, _), reward = call(Gsm8kTool(), {"answer": "5"}, ground_truth="5")
    assert "reward=1.0" in response.text and reward == 1.0
    tool = Gsm8kTool()  # verl's agent loop nests them: create(create_kwargs={...})
    iid, _ = asyncio.run(tool.create(create_kwargs={"ground_truth": "7"}))
    assert tool._instances[iid]["ground_truth"] == "7"
    (bad, _, metrics), _ = call(Gsm8kTool(), {"answer": None}, ground_truth="5")
    assert "must be of type string" in bad.text and metrics == {"error": 1.0}
    with pytest.raises(ValueError, match="needs ground_truth"):
        asyncio.run(Gsm8kTool().create())
    with pytest.raises(KeyError, match="call create\\(\\) before"):
        asyncio.run(Gsm8kTool().execute("nope", {"answer": "1"}))


# ---- search ------------------------------------------------------------------------------------------------
DOCS = [{"id": "d0", "contents": "the cat sat"}, {"id": "d1", "contents": "the dog sat on the mat"},
        {"id": "d2", "contents": "cats and dogs"}]


def test_bm25_golden_scores():
    index = BM25Index(DOCS)
    # N=3, avgdl=(3+6+3)/3=4. "cat" is only in d0: idf = ln(1 + (3-1+0.5)/(1+0.5)) = ln(8/3) = 0.980829;
    # d0: tf=1, |D|=3 -> k1*(1-b+b*3/4) = 1.5*0.8125 = 1.21875; score = 0.980829*2.5/(1+1.21875) = 1.105160.
    assert index.idf("cat") == pytest.approx(math.log(8 / 3))
    assert index.scores("cat") == {0: pytest.approx(1.1051597217)}
    # "the sat": idf = ln(1 + 1.5/2.5) = 0.470004 for both; d1 has tf(the)=2, |D|=6 -> norm 1.5*1.375=2.0625:
    # d1 = 0.470004*(2*2.5/4.0625 + 2.5/3.0625) = 0.962142; d0 = 2*0.470004*2.5/2.21875 = 1.059163.
    scores = index.scores("The sat")
    assert scores[0] == pytest.approx(1.0591631081) and scores[1] == pytest.approx(0.9621424373)
    assert [d["id"] for d, _ in index.search("the sat", topk=1)] == ["d0"]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    rows = DOCS + [{"id": "paris", "contents": "Paris is the capital and largest city of France."}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_search_tool_returns_ranked_passages(corpus):
    tool = SearchTool(config={"corpus_path": corpus, "topk": 2})
    (response, reward, metrics), _ = call(tool, {"query_list": ["capital of France", "dog on a mat"]})
    first, second = response.text.split("\n\n")
    assert first.splitlines()[1].startswith("Doc 1 (id=paris): Paris is the capital")
    assert second.splitlines()[1].startswith("Doc 1 (id=d1)")
    assert reward == 0.0 and metrics == {"num_queries": 2.0}
    (none, _, _), _ = call(tool, {"query_list": ["zebra"]})
    assert "no matching documents" in none.text


@pytest.mark.parametrize("raw, message", [
    ({"query_list": "capital"}, "must be of type array"), ({"query_list": [1, 2]}, "every item"),
    ({"query_list": [" "]}, "at least one non-empty"), ("{'query_list': []}", "not valid JSON"),
])
def test_search_tool_malformed(corpus, raw, message):
    (response, _, metrics), _ = call(SearchTool(config={"corpus_path": corpus}), raw)
    assert message in response.text and metrics == {"error": 1.0}


def test_search_tool_config_errors(tmp_path, corpus):
    with pytest.raises(ValueError, match="needs config.corpus_path"):
        SearchTool(config={})
    with pytest.raises(ValueError, match="did you mean 'topk'"):
        SearchTool(config={"corpus_path": corpus, "top_k": 3})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: each row needs a string field 'contents'"):
        SearchTool(config={"corpus_path": str(bad)})


# ---- code interpreter --------------------------------------------------------------------------------------
def test_code_interpreter_runs_code_and_reports_stops():
    tool = CodeInterpreterTool(config={"default_timeout": 1, "max_output_chars": 200})
    (ok, _, metrics), _ = call(tool, {"code": "print(sum(range(10)))"})
    assert ok.text == "45" and metrics["passed"] == 1.0
    (err, _, _), _ = call(tool, {"code": "1/0"})
    assert "ZeroDivisionError" in err.text
    (slow, _, _), _ = call(tool, {"code": "while True: pass"})
    assert "time limit exceeded" in slow.text
    (big, _, _), _ = call(tool, {"code": "print('y' * 100000)"})
    assert "truncated" in big.text and len(big.text) < 300
    (bad, _, metrics), _ = call(tool, '{"code": 5}')
    assert "must be of type string" in bad.text and metrics == {"error": 1.0}


def test_code_interpreter_accepts_verl_config_keys():
    tool = CodeInterpreterTool(config={"type": "native", "sandbox_fusion_url": "http://x/run_code",
                                       "num_workers": 2, "rate_limit": 10, "default_timeout": 30,
                                       "default_language": "python", "memory_limit_mb": 1024,
                                       "enable_global_rate_limit": False})
    assert tool.sandbox_config.timeout_s == 30 and tool.sandbox_config.memory_mb == 1024
    assert tool.settings.sandbox_fusion_url == "http://x/run_code"
    with pytest.raises(ValueError, match="default_language='cpp' is not supported"):
        CodeInterpreterTool(config={"default_language": "cpp"})
    with pytest.raises(ValueError, match="needs sandbox_fusion_url"):
        CodeInterpreterTool(config={"rate_limit": 3})
    with pytest.raises(ValueError, match="enable_global_rate_limit=true .* set it to false"):
        CodeInterpreterTool(config={"sandbox_fusion_url": "http://x/run_code", "enable_global_rate_limit": True})
    with pytest.raises(ValueError, match="must be an http"):
        CodeInterpreterTool(config={"sandbox_fusion_url": "x/run_code"})


# ---- base API ----------------------------------------------------------------------------------------------
class Exploding(BaseTool):
    default_schema = {"type": "function", "function": {"name": "boom", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError(f"tool bug with x={parameters['x']}")


def test_a_crashing_tool_becomes_error_text():
    (response, reward, metrics), _ = call(Exploding(), '{"x": 3}')
    assert response.text == "Error: boom failed: RuntimeError: tool bug with x=3"
    assert (reward, metrics) == (0.0, {"error": 1.0})
    (typed, _, _), _ = call(Exploding(), '{"x": true}')  # JSON booleans are not integers
    assert "must be of type integer" in typed.text


def test_base_tool_requires_a_schema_and_tracks_instances():
    with pytest.raises(ValueError, match="needs a tool_schema"):
        BaseTool()
    tool = CalculatorTool()

    async def go():
        a, _ = await tool.create("fixed-id")
        b, _ = await tool.create()
        assert a == "fixed-id" and b != a and len(tool._instances) == 2
        await tool.release(a)
        await tool.release(b)
        return len(tool._instances)

    assert asyncio.run(go()) == 0
    assert tool.get_openai_tool_schema().function.name == "calculator"
    assert isinstance(ToolResponse(text="x"), ToolResponse)


def test_function_call_from_raw():
    call_ok, err = OpenAIFunctionCallSchema.from_raw("calculator", '{"expression": "1+1"}')
    assert err is None and call_ok.arguments == {"expression": "1+1"}
    call_bad, err = OpenAIFunctionCallSchema.from_raw("calculator", '{"expression": ')
    assert call_bad.arguments == {} and "not valid JSON" in err
