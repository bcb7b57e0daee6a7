"""verl's own launch command lines that name ``rollout.name=vllm`` (tests/config/data) run 2 steps here.

48 recorded command lines name vLLM; after their sizes and paths are replaced by tiny assets
(``vllm_helpers.tiny_command_line``) many are the same run (the same algorithm and losses at other sizes), so
one command line per distinct algorithm/feature runs here -- each starting its own vLLM engine, which is what
bounds this file's time.  Left out, with the reason:

* vision-language scripts (``*_vl*``, ``glm4*v``, ``minicpmo``, ``geo3k``): need the VLM path (issue 14);
* ``*_rm*`` scripts with ``reward_model.enable=True``: need a reward model checkpoint (a sequence classifier),
  which the tiny assets do not include;
* ``run_deepseek7b_llm_sandbox_fusion.sh``: its reward calls a sandbox service at a remote URL;
* ``*_npu*``: Ascend NPU scripts;
* the GSM8K GRPO / PPO scripts run with more checks in test_vllm_training.py.
"""

from __future__ import annotations

import pytest

from hybridflow.config import parse_command_line
from hybridflow.launch.config import load_config
from vllm_helpers import tiny_command_line, verl_sections

SECTIONS = dict(verl_sections())
DISTINCT = [
    "grpo_trainer/run_qwen2-7b_math.sh",  # GRPO + KL loss, gsm8k+math lists
    "grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh",  # safetensors load format (its LoRA rank is added below)
    "remax_trainer/run_qwen2.5-3b_seq_balance.sh",  # ReMax: greedy baseline rollouts, KL in reward
    "rloo_trainer/run_qwen2-7b.sh",
    "reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh",
    "reinforce_plus_plus_trainer/run_qwen2-7b_math_rf_baseline.sh",
    "gpg_trainer/run_qwen2-7b_math.sh",
    "gspo_trainer/test_gspo_3b_math.sh",
    "otb_trainer/run_qwen2_5-7b.sh",  # optimal token baseline
]
EXTRA = {
    # verl's script sets lora_rank through a shell variable the recording lost; LoRA is what it is about
    "grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh": ["actor_rollout_ref.model.lora_rank=8",
                                                        "actor_rollout_ref.model.lora_alpha=16",
                                                        "actor_rollout_ref.model.target_modules=all-linear",
                                                        "data.prompt_key=prompt"],  # its own data has 'messages'
}


def test_the_listed_sections_name_vllm():
    assert all("actor_rollout_ref.rollout.name=vllm" in SECTIONS[name] for name in DISTINCT)


@pytest.mark.parametrize("name", DISTINCT)
def test_verl_vllm_command_line_trains_two_steps(name, tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cl = parse_command_line(tiny_command_line(SECTIONS[name], tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                                              extra=EXTRA.get(name, ())))
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    metrics = train_ppo(cfg, logger=Tracking("vllm_it", "run", default_backend=["file"], output_dir=tmp_path)).metrics
    assert len(metrics) == 2
    for step in metrics:
        assert step["training/rollout_probs_diff_mean"] <= 1e-4
        assert step["timing_s/update_weights"] > 0
