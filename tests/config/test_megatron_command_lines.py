"""verl's Megatron example command lines, scaled down to this machine, validate on the torch-native N-D engine; one
runs a GRPO step on Ray with 2 CPU workers (slow).

Scaling keeps every key of the recorded script (tests/config/data/verl09_command_lines.txt and, for verl's early-2026
examples, verl_command_lines.txt) and changes only sizes: the devices (4 here, 2 for the run), the parallel sizes
(tensor / expert parallel 2, pipeline 1: pipelining is refused, see test_verl09.py for the scripts as written), the
batch sizes and, for the run, the model, data and rollout engine (hf).  What each scaled layout means is checked
against the mesh the workers build (``ParallelDims.for_role``).
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from hybridflow.engine.parallel_dims import ParallelDims

HERE = Path(__file__).resolve().parent
A = "actor_rollout_ref"


def _verl09():
    spec = importlib.util.spec_from_file_location("hf_test_verl09", HERE / "test_verl09.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.verl09_command_lines())


def _early():
    from vllm_helpers import verl_sections

    return {name.split(": ", 1)[-1].split(" (")[0]: args for name, args in verl_sections()}


# script -> (where it is recorded, tp, ep after scaling, extra overrides the scaling needs)
SCRIPTS = {
    "grpo_trainer/run_qwen3_8b_megatron.sh": ("verl09", 2, 1, []),
    "gpg_trainer/run_qwen3_8b_megatron.sh": ("verl09", 2, 1, []),
    "ppo_trainer/run_qwen3_8b_megatron.sh": ("verl09", 2, 1, []),  # PPO: the critic on the megatron strategy too
    "grpo_trainer/run_qwen3_30b_a3b_megatron.sh": ("verl09", 2, 2, []),  # MoE: tp x ep, offload, recompute keys
    # the recorded layout's shape (tp 2, ep 8 = 4 x tp on 8 GPUs): expert groups over dp x tp
    "gspo_trainer/run_qwen3_30b_a3b_megatron.sh": ("verl09", 2, 4, []),
    "grpo_trainer/run_deepseek_v3_671b_megatron.sh": ("verl09", 1, 2, []),
    "grpo_trainer/run_moonlight_16b_a3b_megatron.sh": ("verl09", 1, 2, []),
    "grpo_trainer/run_qwen3_vl_8b_megatron.sh": ("verl09", 2, 1, []),
    "grpo_trainer/run_qwen2-7b_math_megatron_fsdp.sh": ("verl09", 1, 1, []),
    "gpg_trainer/run_qwen2-7b_math_megatron.sh": ("early", 2, 1, []),  # --config-name=ppo_megatron_trainer
    "grpo_trainer/run_qwen2-7b_megatron.sh": ("early", 2, 1, []),
}

_SIZES = {"pipeline_model_parallel_size": "1", "virtual_pipeline_model_parallel_size": "null",
          "expert_tensor_parallel_size": "1", "context_parallel_size": "1", "use_dist_checkpointing": "false"}
# keys a scaled script cannot keep: trtllm's MoE sizes, an NPU device, layer splits of the pipeline it scales to 1
_DROP = ("actor_rollout_ref.rollout.moe_tensor_parallel_size", "actor_rollout_ref.rollout.expert_parallel_size",
         "dist_checkpointing_path", "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")


def _key(arg: str) -> str:
    return arg.lstrip("+~").partition("=")[0]


def scaled(args: list[str], tp: int, ep: int, devices: int = 4) -> list[str]:
    """The script's overrides with its sizes scaled to ``devices`` (the last value of a key wins)."""
    out = []
    for arg in args:
        key = _key(arg)
        leaf = key.rsplit(".", 1)[-1]
        if any(key.endswith(d) for d in _DROP) or "micro_batch_size" in key:
            continue
        if ".megatron." in key and leaf in _SIZES:
            arg = f"{key}={_SIZES[leaf]}"
        elif ".megatron." in key and leaf == "tensor_model_parallel_size":
            arg = f"{key}={tp}"
        elif ".megatron." in key and leaf == "expert_model_parallel_size":
            arg = f"{key}={ep}"
        out.append(arg)
    return out + [
        f"trainer.n_gpus_per_node={devices}", "trainer.nnodes=1", "data.train_batch_size=8", f"{A}.rollout.n=2",
        f"{A}.actor.ppo_mini_batch_size=4", f"{A}.actor.ppo_micro_batch_size_per_gpu=2",
        f"{A}.rollout.log_prob_micro_batch_size_per_gpu=2", f"{A}.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.forward_micro_batch_size_per_gpu=2", f"{A}.rollout.tensor_model_parallel_size=1",
        "trainer.device=cpu",
    ]


def _script(name: str) -> list[str]:
    where = SCRIPTS[name][0]
    return (_verl09() if where == "verl09" else _early())[name]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_scaled_megatron_command_line_validates_and_lays_out_the_mesh(name):
    _, tp, ep, extra = SCRIPTS[name]
    cl = parse_command_line(scaled(_script(name), tp, ep) + extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    actor = cfg.actor_rollout_ref.actor
    assert actor.strategy == "megatron"
    dims = ParallelDims.for_role(4, actor, f"{A}.actor")
    assert (dims.tp, dims.ep, dims.dp) == (tp, ep, 4 // (tp * dims.sp))
    assert dims.ep_beyond_dp == (dims.dp % ep != 0)
    if cfg.use_critic:
        assert cfg.critic.strategy == "megatron"


@pytest.mark.slow
@pytest.mark.ray
def test_scaled_qwen3_megatron_grpo_runs_a_step_on_ray(ray_cluster, nano_model_dir, tmp_path):
    """verl's grpo_trainer/run_qwen3_8b_megatron.sh (model_engine=megatron, tensor parallel 2) scaled to 2 CPU
    workers, the nano model and the addition task: one GRPO step with the actor and reference split over both ranks,
    the rollout refilled in buckets."""
    from hybridflow.data.synthetic import write_synthetic
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    write_synthetic("addition", str(tmp_path / "data"), train_size=16, test_size=4, seed=0)
    run = scaled(_script("grpo_trainer/run_qwen3_8b_megatron.sh"), tp=2, ep=1, devices=2) + [
        f"{A}.model.path={nano_model_dir}", f"data.train_files={tmp_path}/data/train.parquet",
        f"data.val_files={tmp_path}/data/test.parquet", "data.max_prompt_length=32", "data.max_response_length=4",
        "data.truncation=left", f"{A}.rollout.name=hf", f"{A}.actor.ppo_max_token_len_per_gpu=512",
        f"{A}.rollout.log_prob_max_token_len_per_gpu=512", f"{A}.ref.log_prob_max_token_len_per_gpu=512",
        f"{A}.model.use_remove_padding=true", "trainer.backend=ray", "trainer.total_training_steps=1",
        "trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[file]",
        "trainer.report=false", f"trainer.default_local_dir={tmp_path}/ckpt", "reward_model.num_workers=0",
        f"{A}.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        # a score that changes with every character, so an untrained model's answers get advantages
        f"custom_reward_function.path={HERE.parent / 'integration' / 'reward_fns.py'}",
        "custom_reward_function.name=compute_score_spread",
    ]
    cl = parse_command_line(run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 2
    history = train_ppo(cfg, logger=Tracking("it", "run", default_backend=["file"], output_dir=tmp_path))
    (step,) = [m for m in history.metrics if "timing_s/step" in m]
    assert step["actor/grad_norm"] > 0, step
    assert step["update_weights/bytes"] > 0 and step["update_weights/buckets"] >= 1, step
