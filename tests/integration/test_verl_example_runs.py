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

from pathlib import Path

import pytest

from hybridflow.config import load_config, parse_command_line
from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name
from vllm_helpers import tiny_command_line

DATA = Path(__file__).resolve().parents[1] / "config" / "data"
A = "actor_rollout_ref"


def _sections(name: str) -> dict[str, tuple[str, list[str]]]:
    """script -> (entry module, overrides) of a recording."""
    out, head, args = {}, None, []
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("## "):
            if head:
                out[head[0]] = (head[1], args)
            script, _, module = line[3:].partition(" :: ")
            head, args = (script.strip(), module.strip()), []
        elif line.strip() and not line.startswith("#"):
            args.append(line.strip())
    out[head[0]] = (head[1], args)
    return out


SECTIONS = {**_sections("verl09_command_lines.txt"), **_sections("verl_recipe_command_lines.txt")}
# what each one is about; extras: values the tiny scale needs on top of tiny_command_line's
_ONE_DEVICE = [f"{A}.actor.ulysses_sequence_parallel_size=1", f"{A}.ref.ulysses_sequence_parallel_size=1"]
_DAPO = ["data.gen_batch_size=8", "algorithm.filter_groups.metric=seq_reward",  # the tiny reward has no 'acc'
         "algorithm.filter_groups.max_num_gen_batches=4", "reward_model.overlong_buffer.len=4", *_ONE_DEVICE]
RUNS = {
    "examples/grpo_trainer/run_qwen3_8b_fsdp.sh": [],  # GRPO, KL loss
    "examples/ppo_trainer/run_qwen3_8b_fsdp.sh": [],  # PPO with a critic (GAE)
    "examples/sapo_trainer/run_qwen3_8b_fsdp.sh": [],  # SAPO's soft gate
    "examples/rollout_correction/run_qwen2_5_7b_fsdp.sh": [],  # rollout importance sampling
    "examples/tuning/lora/run_qwen3_8b_merge_fsdp.sh": [f"{A}.model.target_modules=all-linear"],  # LoRA
    "examples/prefix_grouper/run_qwen3_8b_fsdp.sh": [],  # shared-prefix grouping in the actor
    "recipe/dapo/run_dapo_qwen2.5_32b.sh": _DAPO,  # main_dapo, the first recipe's overlong_buffer layout
    "recipe/dapo/test_dapo_7b_math.sh": [  # main_ppo with the reward_kwargs layout
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4", "+reward_model.reward_kwargs.max_resp_len=16",
        *_ONE_DEVICE],
}


def scaled(script: str, model_dir, data_dir, out_dir, extra=()) -> list[str]:
    module, args = SECTIONS[script]
    if module == "recipe.dapo.main_dapo":
        args = with_config_name(args, "dapo_trainer")
    return tiny_command_line(args, model_dir, data_dir, out_dir, steps=1,
                             extra=[f"{A}.rollout.name=hf", "data.max_prompt_length=64", *RUNS[script], *extra])


def train_one_step(script, model_dir, data_dir, out_dir, extra=()):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cl = parse_command_line(scaled(script, model_dir, data_dir, out_dir, extra))
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    history = train_ppo(cfg, logger=Tracking("verl_examples", "run", default_backend=["file"], output_dir=out_dir))
    return cfg, [m for m in history.metrics if "timing_s/step" in m]


def test_the_representative_scripts_are_recorded():
    assert set(RUNS) <= set(SECTIONS)
    assert SECTIONS["recipe/dapo/run_dapo_qwen2.5_32b.sh"][0] == "recipe.dapo.main_dapo"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(RUNS), ids=[s.split("/", 1)[1] for s in sorted(RUNS)])
def test_verl_example_trains_one_step(script, nano_model_dir, addition_data, tmp_path):
    cfg, steps = train_one_step(script, nano_model_dir, addition_data, tmp_path)
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
    _, (grouped,) = train_one_step(script, nano_model_dir, addition_data, tmp_path / "g")
    _, (plain,) = train_one_step(script, nano_model_dir, addition_data, tmp_path / "p",
                                 extra=[f"{A}.actor.use_prefix_grouper=false"])
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss"):
        assert grouped[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
