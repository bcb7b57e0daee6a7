"""verl's own launch command lines must load unchanged (Megatron ones on the torch-native N-D engine, pipeline stages
included); those asking for a missing feature are refused clearly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hybridflow.config import ConfigError, config_to_dict, parse_command_line
from hybridflow.launch.config import load_config
from hybridflow.config.loader import canonical_key

from vllm_helpers import verl_sections as sections  # the recorded scripts, parsed once for both test suites

ACCEPT = [s for s in sections() if not s[0].startswith("refuse")]
PIPELINE = [s for s in sections() if s[0].startswith("pipeline:")]
REFUSE_FEATURE = [s for s in sections() if s[0].startswith("refuse-feature:")]
INERT_MEGATRON = [s for s in sections() if s[0].startswith("inert-megatron:")]


def _resolved(cfg, key: str):
    obj = cfg
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _override_value(arg: str):
    """The value Hydra gives an override (strings unquoted, numbers, bools, lists, dicts, null)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides([arg])[0].value()


def _same(wanted, got) -> bool:
    if isinstance(wanted, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(wanted) == len(got) and all(_same(w, g) for w, g in zip(wanted, got))
    if isinstance(wanted, dict) and isinstance(got, dict):
        return all(k in got and _same(v, got[k]) for k, v in wanted.items())
    if isinstance(wanted, bool) or isinstance(got, bool):
        return wanted is got
    if isinstance(wanted, (int, float)) and isinstance(got, (int, float)):
        return float(wanted) == float(got)
    return wanted == got


# Overrides whose value the config deliberately normalises: verl accepts one bare logger name for a list.
NORMALISED = {"trainer.logger": lambda v: [v] if isinstance(v, str) else v}


@pytest.mark.parametrize("name,args", ACCEPT, ids=[s[0] for s in ACCEPT])
def test_verl_fsdp_command_line_loads(name, args):
    """Every override lands in the typed config (under its current name) with the value the command line gave."""
    cl = parse_command_line(args)
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    for arg in cl.overrides:
        key = canonical_key(arg.lstrip("+").partition("=")[0])
        wanted = NORMALISED.get(key, lambda v: v)(_override_value(arg))
        got = _resolved(cfg, key)
        assert _same(wanted, got), f"{arg}: the config holds {key}={got!r}"


@pytest.mark.parametrize("name,args", REFUSE_FEATURE, ids=[s[0] for s in REFUSE_FEATURE])
def test_command_lines_asking_for_missing_features_are_refused(name, args):
    cl = parse_command_line(args)
    with pytest.raises(ConfigError, match=r"(rollout\.name=trtllm: "
                                          r"this version has no TensorRT-LLM adapter)"):
        load_config(cl.overrides, cl.config_path, cl.config_name)


@pytest.mark.parametrize("name,args", PIPELINE, ids=[s[0] for s in PIPELINE])
def test_megatron_command_lines_with_pipeline_stages_validate(name, args):
    """Pipeline stages are built: the line loads and its roles are laid out pp x dp x tp over the 8 devices."""
    from hybridflow.config.checks.parallel import data_parallel_size
    from hybridflow.engine.parallel_dims import role_layout

    cl = parse_command_line(args)
    cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    for role in ("actor", "ref"):
        layout = role_layout(getattr(cfg.actor_rollout_ref, role))
        assert (layout["pp"], layout["tp"]) == (2, 2), (role, layout)
    assert data_parallel_size(cfg, "actor_rollout_ref.actor") == 8 // (2 * 2)


@pytest.mark.parametrize("name,args", INERT_MEGATRON, ids=[s[0] for s in INERT_MEGATRON])
def test_megatron_keys_without_the_megatron_strategy_are_inert_and_said(name, args):
    """verl ignores a megatron node on an fsdp role; so does hybridflow, and it says so naming the keys and the
    strategy (the roles stay unsplit)."""
    from hybridflow.engine.parallel_dims import role_layout

    cl = parse_command_line(args)
    with pytest.warns(UserWarning, match=r"actor_rollout_ref\.actor\.megatron\.tensor_model_parallel_size, "
                                         r"actor_rollout_ref\.actor\.megatron\.pipeline_model_parallel_size has no "
                                         r"effect: the megatron node is read only with "
                                         r"actor_rollout_ref\.actor\.strategy=megatron"):
        cfg = load_config(cl.overrides, cl.config_path, cl.config_name)
    assert role_layout(cfg.actor_rollout_ref.actor)["pp"] == 1 and role_layout(cfg.actor_rollout_ref.actor)["tp"] == 1


def test_one_script_through_the_console_script(dry_run_assets):
    """verl's command line with its files made real here (the dry run opens config.json and counts rows)."""
    name, args = ACCEPT[0]
    out = subprocess.run([sys.executable, "-m", "hybridflow", "train", "--dry-run", *args, *dry_run_assets,
                          "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "dry run: configuration is valid" in out.stdout


def test_old_spellings_land_on_the_current_keys():
    cl = parse_command_line([
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_gpg_loss=True", "reward_model.sandbox_fusion_url=http://sandbox:8080/run",
        "critic.profile_ranks=[0,1]", "trainer.profile_steps=[1,2,5]", "trainer.logger=console",
    ])
    cfg = load_config(cl.overrides)
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == "gpg"
    assert cfg.reward_model.sandbox_fusion.url == "http://sandbox:8080/run"
    assert cfg.critic.profiler["ranks"] == [0, 1]
    assert cfg.global_profiler["steps"] == [1, 2, 5]
    assert cfg.trainer.logger == ["console"]


def test_keys_added_under_data_reach_custom_datasets_but_typos_do_not():
    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"]
    with pytest.warns(UserWarning, match=r"data.enable_thinking is not a hybridflow key"):
        cfg = load_config(base + ["+data.enable_thinking=True", "+data.sampling_ratios=[0.5,0.5]"])
    assert cfg.data.enable_thinking is True and cfg.data.sampling_ratios == [0.5, 0.5]
    assert config_to_dict(cfg)["data"]["sampling_ratios"] == [0.5, 0.5]
    with pytest.raises(ConfigError, match=r"unknown config key 'data.enable_thinking'.*'\+data.enable_thinking=...'"):
        load_config(base + ["data.enable_thinking=True"])  # without '+' it is a typo until proven otherwise
    with pytest.raises(ConfigError, match=r"unknown config key 'actor_rollout_ref.actor.enable_thinking'"):
        load_config(base + ["+actor_rollout_ref.actor.enable_thinking=True"])  # typed nodes stay strict


def test_verl_config_path_with_the_yaml_config_name_uses_our_defaults():
    cl = parse_command_line(["--config-path=config", "--config-name=ppo_trainer.yaml", "algorithm.adv_estimator=grpo",
                             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    assert load_config(cl.overrides, cl.config_path, cl.config_name).data.max_prompt_length == 512
