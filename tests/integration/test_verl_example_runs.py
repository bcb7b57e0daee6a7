"""A representative set of verl 0.9's FSDP example scripts and verl-recipe's DAPO scripts, as recorded
(tests/config/data/verl09_command_lines.txt, verl_recipe_command_lines.txt), train one step here.

Each command line keeps its own algorithm, loss and feature keys; its sizes and paths are replaced by tiny ones
(``vllm_helpers.tiny_command_line``: the nano model built from a config, the addition task, 4 prompts, one step,
the in-process backend) and its rollout engine by ``hf`` (the vLLM engine runs the same command lines in
tests/rollout_vllm/test_verl_command_lines_vllm.py).  The recipe's ``main_dapo`` lines go through its entry point's
config (``dapo_trainer``).  test_verl09 / test_verl_recipe_command_lines check that every recorded line loads; this
file checks that the representative ones run.
"""

from __future__ import annotations

import pytest

from verl_examples import A, RUNS, SECTIONS, train_one_step

_SHORT_PROMPTS = ["data.max_prompt_length=64"]  # the addition task's prompts are short


def test_the_representative_scripts_are_recorded():
    assert set(RUNS) <= set(SECTIONS)
    assert SECTIONS["recipe/dapo/run_dapo_qwen2.5_32b.sh"][0] == "recipe.dapo.main_dapo"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(RUNS), ids=[s.split("/", 1)[1] for s in sorted(RUNS)])
def test_verl_example_trains_one_step(script, nano_model_dir, addition_data, tmp_path):
    cfg, steps = train_one_step(script, nano_model_dir, addition_data, tmp_path, _SHORT_PROMPTS)
    assert len(steps) == 1
    step = steps[0]
    assert step["actor/grad_norm"] > 0
    if "ppo_trainer" in script:
        assert cfg.algorithm.adv_estimator == "gae" and "critic/vf_loss" in step
    if script.startswith("recipe/dapo"):
        assert cfg.reward_model.reward_manager == "dapo"
        assert cfg.reward_model.reward_kwargs["overlong_buffer_cfg"]["enable"] is True
    if "lora" in script:
        assert cfg.actor_rollout_ref.model.lora_rank > 0


@pytest.mark.slow
def test_prefix_grouper_step_equals_the_ungrouped_step(nano_model_dir, addition_data, tmp_path):
    """verl's prefix_grouper example, one step with and without the grouping: the same samples, so the same
    old log-probs, losses and gradient norm."""
    script = "examples/prefix_grouper/run_qwen3_8b_fsdp.sh"
    _, (grouped,) = train_one_step(script, nano_model_dir, addition_data, tmp_path / "g", _SHORT_PROMPTS)
    # the grouped run cannot take exact log-probs (its layout differs from the rollout's): the plain one neither,
    # so both recompute pi_old the same way
    _, (plain,) = train_one_step(script, nano_model_dir, addition_data, tmp_path / "p",
                                 [*_SHORT_PROMPTS, f"{A}.actor.use_prefix_grouper=false",
                                  f"{A}.rollout.exact_log_probs=false"])
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"):
        assert grouped[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
