"""tests/tiers.py: every full-tier entry names a file or folder that exists, and the matching rules hold."""
from __future__ import annotations

from pathlib import Path

import tiers

HERE = Path(__file__).resolve().parent


def test_every_entry_names_an_existing_test_path_with_a_reason():
    for key, reason in tiers.FULL_TIER.items():
        path = key.split("::")[0]
        assert (HERE / path).exists(), f"tests/tiers.py names {path!r}, which does not exist"
        assert reason.strip(), key
    for path in tiers.FAST_SCENARIOS:
        assert (HERE / path).is_file(), path


def test_prefixes_and_wildcards_match_node_ids():
    assert tiers.in_full_tier("benchmarks/test_bench_smoke.py::test_x")
    assert tiers.in_full_tier("engine/test_tensor_parallel.py::test_four_ranks_equal_the_unsharded_model[ep4-x]")
    assert tiers.in_full_tier("engine/test_tensor_parallel.py::test_merge_turns_any_layout_into_the_trained_hf_model"
                              "[4ranks-ckpt-dp2xtp2-qwen3]")
    assert not tiers.in_full_tier("engine/test_tensor_parallel.py::test_merge_turns_any_layout_into_the_trained_hf_"
                                  "model[2ranks-ckpt-tp2-qwen2]")
    assert not tiers.in_full_tier("engine/test_tensor_parallel.py::test_two_ranks_equal_the_unsharded_model[tp2-q]")
    assert not tiers.in_full_tier("integration/test_learning.py::test_anything")  # a fast scenario in a full folder
    assert tiers.in_full_tier("integration/test_recipes_runs.py::test_anything")
