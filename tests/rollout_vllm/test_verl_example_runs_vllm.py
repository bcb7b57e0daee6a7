"""verl 0.9 / verl-recipe command lines of tests/integration/test_verl_example_runs.py with their own rollout
engine, vLLM, one step each: the recipe's DAPO entry point (dynamic sampling, overlong shaping) and the
prefix-grouper example (the grouped actor forward next to the engine's log-probs).  The rest of the set runs on
vLLM in test_verl_command_lines_vllm.py's early-2026 forms; each extra engine start costs about a minute here."""

from __future__ import annotations

import pytest

from verl_examples import train_one_step

VLLM_RUNS = ["recipe/dapo/run_dapo_qwen2.5_32b.sh", "examples/prefix_grouper/run_qwen3_8b_fsdp.sh"]


@pytest.mark.parametrize("script", VLLM_RUNS, ids=[s.rsplit("/", 1)[1] for s in VLLM_RUNS])
def test_verl_example_trains_one_step_on_vllm(script, tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    cfg, steps = train_one_step(script, tiny_bpe_model_dir, gsm8k_parquet, tmp_path, engine="vllm")
    assert cfg.actor_rollout_ref.rollout.name == "vllm" and len(steps) == 1
    step = steps[0]
    assert step["actor/grad_norm"] > 0
    # the engine's log-probs agree with the actor's recomputation (grouped or not): fp32 on both sides
    assert step["training/rollout_probs_diff_mean"] <= 1e-4, step["training/rollout_probs_diff_mean"]
