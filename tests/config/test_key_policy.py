"""Every accepted key acts, is refused with a reason, or is listed (and noted once) as having no effect here."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from hybridflow.config import ConfigError, ConfigWarning
from hybridflow.launch.config import load_config
from hybridflow.config.key_policy import INERT, REFUSED, default_of, expand, inert_keys_markdown, refused_keys_markdown

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4"]
DOC = Path(__file__).parents[2] / "docs" / "migrating-from-verl.md"


def _between(text: str, tag: str) -> str:
    return re.search(rf"<!-- {tag} -->\n(.*?)\n<!-- /{tag} -->", text, re.S).group(1)


def test_every_listed_key_exists_and_no_key_is_both():
    inert = [k for rule in INERT for k in expand(rule.key)]
    refused = [k for rule in REFUSED for k in expand(rule.key)]
    for key in inert + refused:
        default_of(key)  # raises when the yaml has no such key
    assert not set(inert) & set(refused)
    assert len(inert) == len(set(inert)) and len(refused) == len(set(refused))


def test_the_docs_table_is_the_policy():
    text = DOC.read_text()
    assert _between(text, "key-policy:inert") == inert_keys_markdown()
    assert _between(text, "key-policy:refused") == refused_keys_markdown()


def test_inert_keys_are_noted_together_in_one_note():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        load_config([*BASE, "data.use_shm=true", "actor_rollout_ref.actor.profiler.ranks=[0]",
                     "actor_rollout_ref.model.use_liger=true", "trainer.default_hdfs_dir=hdfs://x/ckpt"])
    notes = [str(w.message) for w in caught if "have no effect" in str(w.message)]
    assert len(notes) == 1
    for key in ("data.use_shm=True", "actor_rollout_ref.actor.profiler.ranks=[0]",
                "actor_rollout_ref.model.use_liger=True", "trainer.default_hdfs_dir='hdfs://x/ckpt'"):
        assert key in notes[0]
    with warnings.catch_warnings(record=True) as caught:  # nothing set: no note at all
        warnings.simplefilter("always", ConfigWarning)
        load_config(BASE)
    assert not [w for w in caught if "have no effect" in str(w.message)]


def _first_leaf(key: str, default):
    """A node's first scalar leaf (a refused node is refused whichever of its keys is set)."""
    while isinstance(default, dict) and default:
        name, default = next(iter(default.items()))
        key = f"{key}.{name}"
    return key, default


@pytest.mark.parametrize("rule", REFUSED, ids=[r.key for r in REFUSED])
def test_each_refused_key_names_itself_and_the_reason(rule):
    key, default = _first_leaf(expand(rule.key)[0], default_of(expand(rule.key)[0]))
    if isinstance(default, bool):
        other = str(not default).lower()
    elif isinstance(default, int):
        other = str(default + 1)
    elif isinstance(default, float):
        other = str(default + 0.5)
    elif isinstance(default, list):
        other = "[x]"
    else:
        other = "{path: /ref}" if key.endswith(".model") else "x"
    if default == {}:
        other = "{a: 1}"
    prefix = "+" if key.endswith(".model") or default == {} else ""
    with pytest.raises(ConfigError) as e:
        load_config([*BASE, f"{prefix}{key}={other}"])
    assert f"{expand(rule.key)[0]}" in str(e.value) and rule.reason[:40] in str(e.value)


def test_refusals_exit_2_and_inert_keys_print_one_note(dry_run_assets):
    out = subprocess.run([sys.executable, "-m", "hybridflow", "train", "--dry-run", *BASE,
                          "actor_rollout_ref.actor.checkpoint.async_save=true"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "checkpoint.async_save=True is not supported" in out.stderr
    out = subprocess.run([sys.executable, "-m", "hybridflow", "train", "--dry-run", *BASE, "data.use_shm=true",
                          "trainer.use_legacy_worker_impl=disable", *dry_run_assets, "data.train_batch_size=8",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert out.stderr.count("have no effect") == 1 and "data.use_shm" in out.stderr \
        and "trainer.use_legacy_worker_impl" in out.stderr


def test_the_pipeline_stage_sizes_are_not_called_inert():
    """override_transformer_config is inert but for the two keys that place layers on the end pipeline stages."""
    m = "actor_rollout_ref.actor.megatron"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        load_config([*BASE, "actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=2",
                     f"{m}.pipeline_model_parallel_size=2",
                     f"+{m}.override_transformer_config.num_layers_in_first_pipeline_stage=1",
                     f"+{m}.override_transformer_config.apply_rope_fusion=true"])
    notes = [str(w.message) for w in caught if "have no effect" in str(w.message)]
    listed = [line.split("=", 1)[0].strip() for line in notes[0].splitlines()[1:]] if len(notes) == 1 else []
    assert listed == [f"{m}.override_transformer_config.apply_rope_fusion"], notes
