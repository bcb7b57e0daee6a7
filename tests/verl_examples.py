"""verl's recorded example / recipe command lines, scaled to this machine (shared by
tests/integration/test_verl_example_runs.py and tests/rollout_vllm/test_verl_example_runs_vllm.py)."""

from __future__ import annotations

from pathlib import Path

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name
from vllm_helpers import tiny_command_line

DATA = Path(__file__).resolve().parent / "config" / "data"
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


def scaled(script: str, model_dir, data_dir, out_dir, extra=(), engine: str = "hf") -> list[str]:
    module, args = SECTIONS[script]
    if module == "recipe.dapo.main_dapo":
        args = with_config_name(args, "dapo_trainer")
    return tiny_command_line(args, model_dir, data_dir, out_dir, steps=1,
                             extra=[f"{A}.rollout.name={engine}", *RUNS[script], *extra])


def train_one_step(script, model_dir, data_dir, out_dir, extra=(), engine: str = "hf"):
    """(config, the step metrics) of one step of ``script`` scaled to this machine, rolling out with ``engine``."""
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cl = parse_command_line(scaled(script, model_dir, data_dir, out_dir, extra, engine))
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    history = train_ppo(cfg, logger=Tracking("verl_examples", "run", default_backend=["file"], output_dir=out_dir))
    return cfg, [m for m in history.metrics if "timing_s/step" in m]


