"""Code reward (hybridflow.rewards.code): extraction, stdin/stdout, fn_name and assert tests, pass fraction."""

from __future__ import annotations

import json

import pytest

from hybridflow.rewards.code import compute_score, evaluate_code, extract_code, stdout_matches

ADD = "Reasoning first.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
IO = json.dumps({"inputs": ["1 2", "3 4", "5 5\n"], "outputs": ["3\n", "7", "10"]})


def test_extract_code_takes_the_last_python_block():
    text = "```python\nprint(1)\n```\nthen\n```bash\nls\n```\n```py\nprint(2)\n```\nend"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("```\nprint(3)\n```") == "print(3)\n"  # untagged block as a fallback
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("no code at all") is None


def test_stdout_cases_give_the_pass_fraction():
    assert compute_score(ADD, IO) == 1.0
    wrong_on_one = json.dumps({"inputs": ["1 2", "3 4", "5 5"], "outputs": ["3", "7", "11"]})
    assert compute_score(ADD, wrong_on_one) == pytest.approx(2 / 3)
    assert compute_score(ADD, {"inputs": [["1 2"]], "outputs": [["3"]]}) == 1.0  # lists of lines, dict input


def test_assert_cases_each_count_once():
    sol = "```python\ndef double(x):\n    return 2 * x\n```"
    gt = {"assert": "import math\nassert double(1) == 2\nassert double(2) == 5\nassert double(math.floor(1.5)) == 2"}
    result = evaluate_code(extract_code(sol), gt)
    assert result.passed == [True, False, True] and result.score == pytest.approx(2 / 3)
    assert compute_score(sol, json.dumps({"assert": ["assert double(0) == 0", "assert double(-1) == -2"]})) == 1.0


def test_fn_name_cases_call_the_function_or_solution_method():
    method = "```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```"
    gt = {"fn_name": "add", "inputs": [[1, 2], [3, 4]], "outputs": [3, [8]]}
    assert evaluate_code(extract_code(method), gt).passed == [True, False]
    function = "```python\ndef add(a, b):\n    return [a, b]\n```"
    assert compute_score(function, {"fn_name": "add", "inputs": [[1, 2]], "outputs": [[1, 2]]}) == 1.0


def test_broken_hanging_and_missing_code_score_zero():
    assert compute_score("I think the answer is 3.", IO) == 0.0
    assert compute_score("```python\nwhile True: pass\n```", IO, timeout_s=0.5) == 0.0
    crash = evaluate_code("import sys\nsys.exit(1)", IO)
    assert crash.statuses == ["fail"] * 3 and crash.score == 0.0
    # A program that exits 0 early without printing does not pass stdout cases.
    assert compute_score("```python\nimport sys; sys.exit(0)\n```", IO) == 0.0


def test_stdout_comparison_rules():
    assert stdout_matches("3 \n4\n\n", "3\n4")
    assert stdout_matches("0.3333333", "0.33333333")  # numeric tolerance 1e-6
    assert not stdout_matches("0.33", "0.34")
    assert not stdout_matches("3 4", "3")


@pytest.mark.parametrize("gt, message", [
    ("not json", "not valid JSON"), ({"inputs": ["1"]}, "must be"), ({"inputs": ["1"], "outputs": []}, "equal length"),
    ({"assert": "x = 1"}, "no assert"), ({"assert": "assert ("}, "not valid Python"),
])
def test_malformed_ground_truth_is_a_clear_error(gt, message):
    with pytest.raises(ValueError, match=message):
        compute_score(ADD, gt)
