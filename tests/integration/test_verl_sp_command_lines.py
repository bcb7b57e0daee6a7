"""verl's launch command lines that set Ulysses sequence parallelism (tests/config/data: the DAPO Qwen3-30B
"moonlight" script, the two GMPO/DAPO scripts, the Qwen3-VL NPU script -- sp = 4 on the actor and the reference)
train one step here, scaled to this machine: the tiny model (the tiny Qwen2.5-VL for the VL script) and local
data in place of theirs, the ``hf`` rollout in place of vLLM, 2 Ray CPU workers with sp = 2 (one script at its
own sp = 4 on 4 workers).  Everything else on each command line -- DAPO reward manager, GMPO loss, token
budgets, offload, gradient checkpointing, ``fsdp_size`` -- is kept."""

from __future__ import annotations

import pytest

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from vllm_helpers import tiny_command_line, verl_sections

SECTIONS = dict(verl_sections())
SP_SECTIONS = sorted(name for name, args in SECTIONS.items() if not name.startswith("refuse")
                     and any(a.startswith("actor_rollout_ref.actor.ulysses_sequence_parallel_size=")
                             and not a.endswith("=1") for a in args))
VL = "grpo_trainer/run_qwen3_vl_30b-fsdp2_npu.sh"
A = "actor_rollout_ref"


def test_the_sp_command_lines_are_found():
    assert len(SP_SECTIONS) == 4 and VL in SP_SECTIONS
    assert all(f"{A}.ref.ulysses_sequence_parallel_size=4" in SECTIONS[n] for n in SP_SECTIONS)


RAY_CPUS = 4  # the shared ray_cluster fixture (conftest.py)


@pytest.fixture(scope="module")
def vision_parquet(tmp_path_factory):
    from hybridflow.data.vision_task import write_vision_task

    d = tmp_path_factory.mktemp("vision_sp")
    write_vision_task("shape_color", str(d), train_size=8, test_size=4, seed=0, size=32)
    return d


def _scaled(name, sp, model_dir, data_dir, out_dir) -> list[str]:
    extra = [f"{A}.rollout.name=hf", "trainer.backend=ray", f"trainer.n_gpus_per_node={sp}",
             f"{A}.actor.ulysses_sequence_parallel_size={sp}", f"{A}.ref.ulysses_sequence_parallel_size={sp}",
             f"{A}.model.enable_gradient_checkpointing=true", f"{A}.actor.ppo_mini_batch_size=4",
             "data.train_batch_size=4", "trainer.total_training_steps=1"]
    if name == VL:
        extra += ["data.max_prompt_length=96", "data.image_key=images"]
    return tiny_command_line(SECTIONS[name], model_dir, data_dir, out_dir, steps=1, extra=extra)


# the two GMPO/DAPO scripts differ only in sizes: one runs at sp = 2, the other at its own sp = 4 on 4 workers
NATIVE = "gmpo_trainer/test_dapo_7b_math.sh"
CASES = [(name, 4 if name == NATIVE else 2) for name in SP_SECTIONS]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("name,sp", CASES, ids=[f"{n.split('/')[-1]}-sp{sp}" for n, sp in CASES])
def test_verl_sp_command_line_trains_one_step(name, sp, ray_cluster, nano_model_dir, tiny_vlm25_dir, addition_data,
                                               vision_parquet, tmp_path):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    vl = name == VL
    cl = parse_command_line(_scaled(name, sp, tiny_vlm25_dir if vl else nano_model_dir,
                                    vision_parquet if vl else addition_data, tmp_path))
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == sp
    metrics = train_ppo(cfg, logger=Tracking("sp_cl", "run", default_backend=["file"], output_dir=tmp_path)).metrics
    steps = [m for m in metrics if "timing_s/step" in m]
    assert len(steps) == 1
    assert steps[0]["perf/actor_sp_comm_mb"] > 0 and steps[0]["actor/grad_norm"] > 0
