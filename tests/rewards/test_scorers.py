"""Built-in scorers with hand-written cases: GSM8K, MATH (math-verify), DAPO math, countdown, dispatch."""

from __future__ import annotations

import pytest

from hybridflow.rewards import default_compute_score
from hybridflow.rewards.scorers import gsm8k, math_dapo
from hybridflow.rewards.scorers.arith import ExpressionError, evaluate
from hybridflow.rewards.scorers.boxed import extract_boxed_answer, last_boxed_only_string


class TestGSM8K:
    def test_strict(self):
        assert default_compute_score("openai/gsm8k", "5 + 5 = 10\n#### 10", "10") == 1.0
        assert default_compute_score("openai/gsm8k", "#### 1,000", "1000") == 1.0
        assert default_compute_score("openai/gsm8k", "#### 11", "10") == 0.0
        assert default_compute_score("openai/gsm8k", "the answer is 10", "10") == 0.0  # no marker
        assert default_compute_score("openai/gsm8k", "#### 3 then #### -4", "-4") == 1.0  # last marker wins

    def test_only_last_300_chars(self):
        early = "#### 10" + " filler" * 60
        assert len(early) > 300
        assert default_compute_score("openai/gsm8k", early, "10") == 0.0

    def test_flexible_and_format_score(self):
        assert gsm8k.extract_solution("we get 12 apples, then 15.", method="flexible") == "15"
        assert default_compute_score("openai/gsm8k", "so it is 42.", "42", method="flexible") == 1.0
        assert gsm8k.compute_score("#### 7", "8", format_score=0.1) == 0.1
        with pytest.raises(ValueError, match="'strict' or 'flexible'"):
            gsm8k.extract_solution("x", method="loose")


class TestMATH:
    @pytest.mark.parametrize(
        "response, gt",
        [
            ("so \\boxed{\\frac{1}{2}}", "0.5"),
            ("so \\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"),
            ("first \\boxed{1} then \\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
            ("\\boxed{x^2+2x+1}", "(x+1)^2"),
            ("\\boxed{10}", "\\boxed{10}"),
        ],
    )
    def test_equivalent_forms(self, response, gt):
        assert default_compute_score("lighteval/MATH", response, gt) == 1.0

    def test_wrong_or_missing(self):
        assert default_compute_score("HuggingFaceH4/MATH-500", "\\boxed{0.6}", "\\frac{1}{2}") == 0.0
        assert default_compute_score("DigitalLearningGmbH/MATH-lighteval", "the answer is 1/2", "\\frac{1}{2}") == 0.0

    def test_boxed_extraction(self):
        assert last_boxed_only_string("a \\boxed{\\frac{1}{2}} b") == "\\boxed{\\frac{1}{2}}"
        assert extract_boxed_answer("\\fbox{7}") == "7"
        assert extract_boxed_answer("\\boxed 5$") == "5"
        assert extract_boxed_answer("\\boxed{unclosed") is None


class TestDAPO:
    def test_plus_minus_one(self):
        assert default_compute_score("math_dapo", "reasoning...\nAnswer: 204", "204") == {
            "score": 1.0, "acc": True, "pred": "204"}
        out = default_compute_score("aime2025", "Answer: 205", "204")
        assert out == {"score": -1.0, "acc": False, "pred": "205"}
        assert default_compute_score("math", "no answer line", "204")["pred"] == "[INVALID]"

    def test_normalisation(self):
        assert math_dapo.normalize_final_answer("x = \\$1,000.") == "1000"
        assert math_dapo.normalize_final_answer("\\boxed{12} degrees") == "12"
        assert math_dapo.normalize_final_answer("\\text{5 units}") == "5"
        assert default_compute_score("math_dapo", "Answer: 7.0", "7")["acc"] is True
        assert default_compute_score("math_dapo", "\\boxed{9}", "9", strict_box_verify=True)["score"] == 1.0


class TestCountdown:
    GT = {"target": 14, "numbers": [3, 4, 2]}

    def test_scores(self):
        assert default_compute_score("countdown", "<think>..</think><answer>(3+4)*2</answer>", self.GT) == 1.0
        assert default_compute_score("countdown", "<answer>3*4+2</answer>", self.GT) == 1.0
        assert default_compute_score("countdown", "<answer>3*4+3</answer>", self.GT) == 0.1  # wrong numbers
        assert default_compute_score("countdown", "<answer>3*4</answer>", self.GT) == 0.1  # not all used
        assert default_compute_score("countdown", "<answer>__import__('os')</answer>", self.GT) == 0.1
        assert default_compute_score("countdown", "(3+4)*2", self.GT) == 0.0  # no tag
        assert default_compute_score("countdown", "<answer>28/2</answer>", {"target": 14, "nums": [28, 2]}) == 1.0

    def test_safe_evaluation(self):
        assert evaluate("6/4*2") == 3
        for bad in ("2**100", "a+1", "1/0", "(1).real"):
            with pytest.raises(ExpressionError):
                evaluate(bad)

    def test_bad_ground_truth(self):
        with pytest.raises(ValueError, match="countdown ground_truth must be a dict"):
            default_compute_score("countdown", "<answer>1</answer>", "14")


def test_unknown_data_source_points_to_custom_function():
    with pytest.raises(NotImplementedError) as err:
        default_compute_score("my/dataset", "x", "y")
    assert "'my/dataset'" in str(err.value) and "custom_reward_function.path" in str(err.value)


def test_code_sources_dispatch_to_the_sandbox_scorer():
    gt = '{"inputs": ["2\\n"], "outputs": ["4\\n"]}'
    assert default_compute_score("apps", "```python\nprint(int(input()) * 2)\n```", gt) == 1.0
