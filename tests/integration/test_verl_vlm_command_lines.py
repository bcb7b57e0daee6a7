"""verl's vision-language launch command lines (geo3k / chartqa GRPO scripts for Qwen2.5-VL, GLM-4.xV,
MiniCPM-o, Mistral-3.1; tests/config/data) run 2 GRPO steps here with tiny assets in place of their sizes and
paths: the tiny Qwen2.5-VL (the only VLM family supported; the GLM / MiniCPM / Mistral scripts run with it
too), the synthetic shape-colour pictures in place of geo3k/chartqa, and the ``hf`` rollout in place of
vLLM/SGLang (no accelerator here). Everything else on each command line -- its algorithm, KL, loss and data
keys (``data.image_key``, ``filter_overlong_prompts``, LoRA, sequence balancing) -- is kept."""

from __future__ import annotations

import pytest

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from vllm_helpers import tiny_command_line, verl_sections

SECTIONS = dict(verl_sections())
VLM_SECTIONS = sorted(name for name, args in SECTIONS.items() if not name.startswith("refuse")
                      and any("geo3k" in a or "chartqa" in a or "-VL-" in a for a in args)
                      # sequence-parallel ones need several ranks: test_verl_sp_command_lines.py runs them on Ray
                      and not any("ulysses_sequence_parallel_size=4" in a for a in args))


# per script: what its recording needs that the tiny assets cannot give
EXTRA = {
    # its dataset class lives in verl's recipe/ folder (MiniCPM-o's own preprocessing): the stock dataset here
    "grpo_trainer/run_minicpmo2_6.sh": ["data.custom_cls.path=null", "data.custom_cls.name=null"],
    # it names Mistral's decoder layer class to shard; the tiny stand-in is a Qwen2.5-VL (the key acts: a class the
    # model lacks is an error naming it)
    "grpo_trainer/run_mistral3_1_24b.sh": [
        f"actor_rollout_ref.{role}.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2_5_VLDecoderLayer]"
        for role in ("actor", "ref")],
}


def test_the_vision_language_command_lines_are_found():
    assert len(VLM_SECTIONS) >= 8 and sum("qwen2_5_vl" in n for n in VLM_SECTIONS) >= 5


@pytest.fixture(scope="module")
def vision_parquet(tmp_path_factory):
    from hybridflow.data.vision_task import write_vision_task

    d = tmp_path_factory.mktemp("vision_cl")
    write_vision_task("shape_color", str(d), train_size=16, test_size=4, seed=0, size=32)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("name", VLM_SECTIONS)
def test_verl_vlm_command_line_trains_two_steps(name, tiny_vlm25_dir, vision_parquet, tmp_path):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    extra = ["actor_rollout_ref.rollout.name=hf", "data.max_prompt_length=96", "data.image_key=images",
             *EXTRA.get(name, ())]
    cl = parse_command_line(tiny_command_line(SECTIONS[name], tiny_vlm25_dir, vision_parquet, tmp_path, extra=extra))
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    metrics = train_ppo(cfg, logger=Tracking("vlm_cl", "run", default_backend=["file"], output_dir=tmp_path)).metrics
    steps = [m for m in metrics if "timing_s/step" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["training/rollout_probs_diff_max"] < 1e-4  # rollout and actor saw the same pixels
