"""``--config-path/--config-name`` with overrides of free-form nodes (verl's sglang_multiturn scripts).

A user config with ``defaults: [ppo_trainer, _self_]`` composes with our defaults; overrides of keys inside
free-form nodes (``global_profiler``, ``rollout.engine_kwargs.vllm``) must apply as they do without
``--config-name``, and a typo'd key still gets the closest valid key.
"""

from __future__ import annotations

import textwrap

import pytest

from hybridflow.config import ConfigError, parse_command_line
from hybridflow.launch.config import load_config

MULTITURN_YAML = """
hydra:
  searchpath:
    - file://verl/trainer/config
defaults:
  - ppo_trainer
  - _self_
data:
  max_prompt_length: 256
  max_response_length: 256
  train_batch_size: 8
  return_raw_chat: True
actor_rollout_ref:
  hybrid_engine: True
  rollout:
    multi_turn:
      enable: True
      max_assistant_turns: 3
"""

SIZES = ["actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]


@pytest.fixture
def config_dir(tmp_path):
    (tmp_path / "gsm8k_multiturn_grpo.yaml").write_text(textwrap.dedent(MULTITURN_YAML))
    return tmp_path


def test_free_form_overrides_apply_with_a_config_name(config_dir):
    cl = parse_command_line([f"--config-path={config_dir}", "--config-name=gsm8k_multiturn_grpo", *SIZES,
                             "global_profiler.tool=nsys", "global_profiler.steps=[1,2]",
                             "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    # global_profiler is verl 0.9's node (its other defaults stay); the overridden keys took the new values
    assert cfg.global_profiler["tool"] == "nsys" and cfg.global_profiler["steps"] == [1, 2]
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_assistant_turns == 3  # the user file still applies
    assert cfg.data.max_prompt_length == 256


def test_free_form_overrides_apply_the_same_without_a_config_name():
    cfg = load_config([*SIZES, "data.train_batch_size=8", "global_profiler.tool=nsys",
                       "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert cfg.global_profiler["tool"] == "nsys"
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}


def test_a_typo_under_a_config_name_names_the_closest_key(config_dir):
    with pytest.raises(ConfigError, match="did you mean 'actor_rollout_ref.rollout.multi_turn.max_assistant_turns'"):
        load_config([*SIZES, "actor_rollout_ref.rollout.multi_turn.max_asistant_turns=2"], str(config_dir),
                    "gsm8k_multiturn_grpo")


def test_a_key_only_the_user_file_adds_can_be_overridden(config_dir):
    (config_dir / "with_extra.yaml").write_text(textwrap.dedent("""
        defaults:
          - ppo_trainer
          - _self_
        data:
          custom_field: 1
    """))
    with pytest.warns(UserWarning, match="data.custom_field is not a hybridflow key"):
        cfg = load_config([*SIZES, "data.train_batch_size=8", "data.custom_field=5"], str(config_dir), "with_extra")
    assert cfg.data.custom_field == 5
