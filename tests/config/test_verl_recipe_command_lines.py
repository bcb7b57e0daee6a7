"""verl-recipe's DAPO command lines (``python -m recipe.dapo.main_dapo`` with the recipe's dapo_trainer.yaml, and the
recipe's ``verl.trainer.main_ppo`` scripts) load here unchanged, or are refused naming why; verl's own
dapo_trainer.yaml, in both its layouts, works through ``--config-path``.  Recorded by tests/config/verl09/extract.py
(``recipe dapo``) into data/verl_recipe_command_lines.txt; one of them trains a step in
tests/integration/test_verl_recipe_runs.py.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from hybridflow.config import ConfigError, parse_command_line
from hybridflow.launch.config import load_config
from hybridflow.recipe.dapo.main_dapo import CONFIG_NAME
from hybridflow.experimental.one_step_off_policy.main_ppo import with_config_name

DATA = Path(__file__).parent / "data" / "verl_recipe_command_lines.txt"
BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4"]


def recipe_command_lines() -> list[tuple[str, str, list[str]]]:
    """(script, entry module, arguments) of every recorded launch."""
    out, head, args = [], None, []
    for line in DATA.read_text().splitlines():
        if line.startswith("## "):
            if head:
                out.append((*head, args))
            script, _, module = line[3:].partition(" :: ")
            head, args = (script.strip(), module.strip()), []
        elif line.strip() and not line.startswith("#"):
            args.append(line.strip())
    out.append((*head, args))
    return out


ENTRY_POINTS = {"recipe.dapo.main_dapo": CONFIG_NAME, "verl.trainer.main_ppo": None}
_NPU = r"trainer.device='npu' is not supported"
# The Megatron lines (pipeline stages, use_dist_checkpointing included) load on the torch-native N-D engine.
REFUSED = {
    "recipe/dapo/run_dapo_qwen2.5_32b_fsdp2_20k_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen2.5_32b_fsdp2_4k_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen2.5_7b_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen2.5_vl_32b_fsdp2_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen2.5_vl_3b_fsdp2_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen2.5_vl_7b_fsdp2_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen3_30b_fsdp_6k_npu.sh": _NPU,
    "recipe/dapo/run_dapo_qwen3_vl_30b_fsdp2_npu.sh": _NPU,
    "recipe/dapo/test_dapo_8b_megatron_fp8train.sh": r"actor_rollout_ref.rollout.mode='sync'",
    "recipe/dapo/test_dapo_dspk_671b_megatron_96gb.sh": r"model.path=<path_to_dsv3_config>",  # a placeholder
    # rollout-correction keys verl itself removed (its rollout_correction node has neither any more)
    "recipe/dapo/run_dapo_qwen2.5_32b_rollout_corr.sh": r"unknown config key 'algorithm.rollout_correction."
                                                         r"rollout_rs_threshold_lower'",
}
RUNNABLE = [(s, m, a) for s, m, a in recipe_command_lines() if m in ENTRY_POINTS]


def load_recorded(module: str, args: list[str], extra=()):
    cl = parse_command_line(with_config_name(args, ENTRY_POINTS[module]) if ENTRY_POINTS[module] else args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([*cl.overrides, *extra], cl.config_path, cl.config_name)


def test_the_recording_has_the_dapo_entry_points():
    modules = {m for _, m, _ in recipe_command_lines()}
    assert {"recipe.dapo.main_dapo", "verl.trainer.main_ppo"} <= modules
    assert set(REFUSED) <= {s for s, _, _ in RUNNABLE}
    # the one entry point not provided: verl's TransferQueue variant of the recipe (its V1 data plane is refused)
    assert modules - set(ENTRY_POINTS) == {"recipe.dapo.dapo_transfer_queue.main_dapo"}


@pytest.mark.parametrize("script,module,args", RUNNABLE, ids=[s.removeprefix("recipe/dapo/") for s, _, _ in RUNNABLE])
def test_recipe_command_line_loads_or_is_refused_with_its_reason(script, module, args):
    if script in REFUSED:
        with pytest.raises(ConfigError) as e:
            load_recorded(module, args)
        assert re.search(REFUSED[script], str(e.value)), str(e.value)[:600]
        return
    cfg = load_recorded(module, args)
    rm = cfg.reward_model
    assert rm.reward_manager == "dapo"
    given = {a.partition("=")[0].lstrip("+").rpartition(".")[2]: a.partition("=")[2] for a in args
             if "overlong_buffer" in a}
    if not given:  # (a line that sets no overlong buffer, e.g. a Megatron one on ppo_megatron_trainer)
        return
    overlong = rm.reward_kwargs["overlong_buffer_cfg"]
    assert str(overlong["enable"]).lower() == given["enable"].lower() and overlong["len"] == int(given["len"])


def test_old_layout_lands_on_the_reward_kwargs_and_max_resp_len_follows_the_response_length():
    """The first DAPO recipe's ``reward_model.overlong_buffer.*``; its manager gets data.max_response_length."""
    from hybridflow.rewards.manager_factory import load_reward_manager
    from hybridflow.utils.tiny_model import build_char_tokenizer

    cfg = load_config([*BASE, "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=8",
                       "reward_model.overlong_buffer.penalty_factor=1.0", "data.max_response_length=32"],
                      config_name=CONFIG_NAME)
    assert cfg.reward_model.reward_kwargs["overlong_buffer_cfg"] == {"enable": True, "len": 8, "penalty_factor": 1.0,
                                                                    "log": False}
    manager = load_reward_manager(cfg, build_char_tokenizer())
    try:
        assert manager.max_resp_len == 32
        assert manager.overlong_reward(24) == 0.0 and manager.overlong_reward(28) == -0.5  # 4 of 8 into the buffer
    finally:
        manager.close()


# verl's dapo_trainer.yaml, both layouts (the keys a verl user's --config-path brings; comments our own)
_HEAD = "hydra:\n  searchpath:\n    - file://verl/trainer/config\ndefaults:\n  - ppo_trainer\n  - _self_\n"
_FILTER = ("algorithm:\n  filter_groups:\n    _target_: verl.trainer.config.FilterGroupsConfig\n    enable: False\n"
           "    metric: null\n    max_num_gen_batches: 0\ntrainer:\n  project_name: verl-dapo\n"
           "data:\n  gen_batch_size: ${data.train_batch_size}\n")
VERL_YAML = {
    "first": _HEAD + _FILTER + "reward_model:\n  reward_manager: dapo\n  overlong_buffer:\n    enable: False\n"
                               "    len: 0\n    penalty_factor: 0.0\n    log: False\n",
    "verl09": _HEAD + _FILTER + "reward:\n  reward_manager:\n    name: dapo\n  reward_kwargs:\n"
                                "    overlong_buffer_cfg:\n      enable: False\n      len: 0\n"
                                "      penalty_factor: 0.0\n      log: False\n    max_resp_len: null\n",
}


@pytest.mark.parametrize("layout", sorted(VERL_YAML))
def test_verls_dapo_trainer_yaml_through_config_path(layout, tmp_path):
    (tmp_path / "dapo_trainer.yaml").write_text(VERL_YAML[layout])
    over = (["reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=16"] if layout == "first"
            else ["reward.reward_kwargs.overlong_buffer_cfg.enable=True",
                  "reward.reward_kwargs.overlong_buffer_cfg.len=16"])
    cfg = load_config([*BASE, *over, "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"],
                      str(tmp_path), "dapo_trainer")
    assert cfg.reward_model.reward_manager == "dapo" and cfg.trainer.project_name == "verl-dapo"
    assert cfg.reward_model.reward_kwargs["overlong_buffer_cfg"]["enable"] is True  # the command line wins
    assert cfg.reward_model.reward_kwargs["overlong_buffer_cfg"]["len"] == 16
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric == "acc"
    assert cfg.data.gen_batch_size == cfg.data.train_batch_size


def test_a_target_naming_a_class_of_your_own_is_refused(tmp_path):
    (tmp_path / "mine.yaml").write_text(_HEAD + "algorithm:\n  filter_groups:\n    _target_: my_pkg.MyFilterConfig\n"
                                                "    enable: True\n    metric: acc\n")
    with pytest.raises(ConfigError, match=r"algorithm.filter_groups._target_='my_pkg.MyFilterConfig'.*own"):
        load_config(BASE, str(tmp_path), "mine")


def test_the_dapo_megatron_config_puts_the_roles_on_the_megatron_engine():
    cfg = load_config(BASE, config_name="dapo_megatron_trainer")
    assert cfg.actor_rollout_ref.actor.strategy == "megatron" and cfg.critic.strategy == "megatron"
    assert cfg.reward_model.reward_manager == "dapo"


def test_main_dapo_dry_run_through_python_m(dry_run_assets, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hybridflow.recipe.dapo.main_dapo", "--dry-run", *BASE,
                          "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=4",
                          "data.max_response_length=8", *dry_run_assets, "data.train_batch_size=8",
                          "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                          "reward_model.num_workers=0"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "reward_manager: dapo" in out.stdout and "project_name: verl-dapo" in out.stdout
    assert re.search(r"overlong_buffer_cfg:\s+enable: true\s+len: 4", out.stdout)
