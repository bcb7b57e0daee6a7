"""Strict and lenient math accuracies side by side in validation, named by their answer extractor."""

from __future__ import annotations

import numpy as np
import pytest

from hybridflow.protocol import DataProto
from hybridflow.rewards.scorers.answer_variants import answer_variants, variant_names
from hybridflow.tracking.validation_metrics import process_validation_metrics
from hybridflow.trainer.validation import add_answer_variants


@pytest.mark.parametrize("source,response,truth,strict,lenient", [
    ("openai/gsm8k", "5 + 5 = 10\n#### 10", "10", 1.0, 1.0),
    ("openai/gsm8k", "so the answer is 10.", "10", 0.0, 1.0),  # no marker: only the lenient reading finds it
    ("openai/gsm8k", "#### 11", "10", 0.0, 0.0),
    ("lighteval/MATH", "so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0, 1.0),
    ("lighteval/MATH", "so \\boxed{0.5}", "\\frac{1}{2}", 0.0, 1.0),  # equivalent, not the same string
    ("math_dapo", "work\nAnswer: 204", "204", 1.0, 1.0),
    ("aime2024", "work, \\boxed{204}", "204", 0.0, 1.0),  # boxed but no Answer: line
])
def test_each_math_source_reads_the_answer_two_ways(source, response, truth, strict, lenient):
    strict_name, lenient_name = variant_names(source)
    assert strict_name.startswith("acc_strict_") and lenient_name.startswith("acc_lenient_")
    assert answer_variants(source, response, truth) == {strict_name: strict, lenient_name: lenient}


def test_non_math_rows_get_none_and_metrics_show_both_readings():
    batch = DataProto.from_dict(non_tensors={
        "data_source": np.array(["openai/gsm8k", "openai/gsm8k", "synthetic/addition"], dtype=object),
        "reward_model": np.array([{"ground_truth": "10"}, {"ground_truth": "10"}, {"ground_truth": "3"}],
                                 dtype=object)})
    columns: dict = {}
    add_answer_variants(columns, 0, batch, ["#### 10", "it is 10", "3"])
    assert columns == {"acc_strict_hash_marker": [1.0, 0.0], "acc_lenient_last_number": [1.0, 1.0]}
    infos = {"reward": [1.0, 0.0, 1.0], **{k: v + [None] for k, v in columns.items()}}
    m = process_validation_metrics(["openai/gsm8k"] * 2 + ["synthetic/addition"], ["q", "q", "r"], infos)
    assert m["val-aux/openai/gsm8k/acc_strict_hash_marker/mean@2"] == 0.5
    assert m["val-aux/openai/gsm8k/acc_lenient_last_number/mean@2"] == 1.0
    assert m["val-aux/openai/gsm8k/acc_strict_hash_marker/pass@2"] == 1.0
    assert not any("synthetic/addition/acc_" in k for k in m)
