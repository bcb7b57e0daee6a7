"""``*.ulysses_sequence_parallel_size`` acts: a valid value builds dp x sp, an impossible one is a config error
naming the key and the fix, and the mini-batch arithmetic divides by dp = devices / sp (verl's rule)."""

from __future__ import annotations

import warnings

import pytest

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config
from hybridflow.config.checks.parallel import data_parallel_size

A = "actor_rollout_ref"
BASE = [f"{A}.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
        "data.train_batch_size=4", f"{A}.actor.ppo_mini_batch_size=2", f"{A}.rollout.n=2", "critic.ppo_mini_batch_size=2",
        "trainer.n_gpus_per_node=4", "trainer.device=cpu"]


def _load(*overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config([*BASE, *overrides])


def test_sp_divides_the_devices_into_data_parallel_groups(nano_model_dir):
    cfg = _load(f"{A}.model.path={nano_model_dir}", f"{A}.actor.ulysses_sequence_parallel_size=4",
                "algorithm.adv_estimator=gae", f"critic.model.path={nano_model_dir}",
                "critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=true")
    assert cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 4  # verl: the reference follows the actor
    assert data_parallel_size(cfg, f"{A}.actor") == 1 and data_parallel_size(cfg, "critic") == 2
    # 1 prompt x 2 responses per mini-batch: fine over 2 dp groups, not over 4 devices
    _load(f"{A}.actor.ppo_mini_batch_size=1", f"{A}.actor.ulysses_sequence_parallel_size=2")
    with pytest.raises(ConfigError, match=r"2 trajectories per mini-batch cannot be split over 4 devices"):
        _load(f"{A}.actor.ppo_mini_batch_size=1")


@pytest.mark.parametrize("overrides,match", [
    ([f"{A}.actor.ulysses_sequence_parallel_size=3"], r"ulysses_sequence_parallel_size=3 must divide .* 4 devices"),
    ([f"{A}.actor.ulysses_sequence_parallel_size=0"], r"actor.ulysses_sequence_parallel_size=0: must be >= 1"),
    ([f"{A}.actor.ulysses_sequence_parallel_size=2", f"{A}.actor.use_remove_padding=false"],
     r"needs actor_rollout_ref.actor.use_remove_padding=true"),
    (["reward_model.enable=true", "reward_model.ulysses_sequence_parallel_size=2",
      "reward_model.model.use_remove_padding=false"], r"needs reward_model.model.use_remove_padding=true"),
    ([f"{A}.actor.ulysses_sequence_parallel_size=2", "trainer.backend=local"], r"the local backend runs one process"),
    ([f"{A}.actor.ulysses_sequence_parallel_size=2", f"{A}.ref.ulysses_sequence_parallel_size=1",
      f"{A}.model.lora_rank=4"], r"with LoRA the reference policy is the actor"),
])
def test_impossible_sp_settings_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        _load(*overrides)


def test_head_counts_are_checked_against_the_checkpoint(nano_model_dir):
    # the nano model has 4 attention heads and 2 key/value heads
    _load(f"{A}.model.path={nano_model_dir}", f"{A}.actor.ulysses_sequence_parallel_size=4")  # kv heads repeated
    with pytest.raises(ConfigError, match=r"ulysses_sequence_parallel_size=8: the model has 4 attention heads"):
        _load(f"{A}.model.path={nano_model_dir}", f"{A}.actor.ulysses_sequence_parallel_size=8",
              "trainer.n_gpus_per_node=8")


def test_dry_run_describes_the_data_parallel_share():
    from hybridflow.launch.command_line import describe_batch_sizes

    text = describe_batch_sizes(_load(f"{A}.actor.ulysses_sequence_parallel_size=2"))
    assert "4 trajectories (2 per data-parallel group of 2 devices, each holding 1/2 of the tokens)" in text
    assert "1 trajectories per data-parallel group" in text
    assert "(1 per device)" in describe_batch_sizes(_load())
