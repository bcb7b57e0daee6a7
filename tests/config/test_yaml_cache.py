"""Config YAML files are parsed once per process (``config/yaml_cache.py``): the composed config is the one an
uncached compose gives, an edited file is read again, and one composition cannot leak into the next."""

from __future__ import annotations

import json
import os
import textwrap

from hybridflow.config import config_to_dict
from hybridflow.launch.config import load_config

BASE = ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=1"]
MICRO = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2"]


def _write(path, n: int) -> None:
    path.write_text(textwrap.dedent(f"""
        defaults:
          - ppo_trainer
          - _self_
        algorithm:
          adv_estimator: grpo
        actor_rollout_ref:
          rollout: {{n: {n}}}
          actor: {{ppo_micro_batch_size_per_gpu: 2}}
    """))


def test_an_edited_config_file_is_read_again(tmp_path):
    path = tmp_path / "mine.yaml"
    _write(path, 4)
    assert load_config(BASE, config_path=str(tmp_path), config_name="mine").actor_rollout_ref.rollout.n == 4
    _write(path, 6)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # a new stamp in any case
    assert load_config(BASE, config_path=str(tmp_path), config_name="mine").actor_rollout_ref.rollout.n == 6


def test_overrides_of_one_load_do_not_leak_into_the_next():
    first = load_config(BASE + MICRO + ["actor_rollout_ref.rollout.n=5", "+actor_rollout_ref.rollout.engine_kwargs.hf.x=1"])
    again = load_config(BASE + MICRO)
    assert first.actor_rollout_ref.rollout.n == 5 and again.actor_rollout_ref.rollout.n == 1
    assert "x" not in (again.actor_rollout_ref.rollout.engine_kwargs.get("hf") or {})


def test_the_cached_compose_equals_hydras_own(monkeypatch):
    from hydra._internal.core_plugins.file_config_source import FileConfigSource
    from hydra._internal.sources_registry import SourcesRegistry

    from hybridflow.config import yaml_cache

    assert yaml_cache.install()
    args = BASE + MICRO + ["algorithm.adv_estimator=grpo"]
    cached = json.dumps(config_to_dict(load_config(args)), sort_keys=True, default=str)
    monkeypatch.setitem(SourcesRegistry.instance().types, "file", FileConfigSource)  # Hydra's source, no cache
    plain = json.dumps(config_to_dict(load_config(args)), sort_keys=True, default=str)
    assert cached == plain
