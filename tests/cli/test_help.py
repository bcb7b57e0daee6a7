"""``--help`` on every command, and ``hybridflow train --help NODE`` from the config reference that also writes
docs/config.md's tables (one source)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.cli.config_reference import (
    GROUPS,
    SECTIONS,
    defaults_tree,
    key_lines,
    render_docs,
    row_keys,
)
from hybridflow.cli.help import format_value

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def hybridflow(*args: str, module: str = "hybridflow") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


def _leaves(tree, prefix=""):
    if isinstance(tree, dict) and tree:
        return [x for k, v in tree.items() for x in _leaves(v, f"{prefix}.{k}" if prefix else k)]
    return [(prefix, tree)]


def test_docs_config_tables_are_written_from_the_reference():
    text = DOC.read_text(encoding="utf-8")
    assert render_docs(text) == text, ("docs/config.md differs from hybridflow/cli/config_reference_rows.py: edit the "
                                       "rows, then run python -m hybridflow.cli.config_reference --write")


def test_every_row_names_keys_that_exist_and_every_group_is_a_top_level_node():
    for section in SECTIONS:
        for row in section.rows:
            assert row_keys(section, row), f"{section.name}: the row {row.keys} names no key of ppo_trainer.yaml"
    assert [name for name, _ in GROUPS] == list(defaults_tree())


def test_every_key_of_the_tree_has_a_default_and_a_line():
    lines = {f"{group}.{kl.key}" if kl.key != group else group: kl for group, _ in GROUPS for kl in key_lines(group)}
    leaves = dict(_leaves(defaults_tree()))
    assert set(lines) == set(leaves)
    assert not [k for k, kl in lines.items() if not kl.line.strip()], "keys without a line in --help"
    assert all(lines[k].default == v for k, v in leaves.items())


def test_train_help_lists_options_groups_and_the_dry_run():
    out = hybridflow("train", "--help")
    assert out.returncode == 0 and not out.stderr, out.stderr
    for word in ("--dry-run", "--config-path", "--config-name", "--help [NODE]"):
        assert word in out.stdout
    listed = [line.split()[0] for line in out.stdout.split("config groups")[1].splitlines()[1:] if line.startswith("  ")]
    assert listed == [name for name, _ in GROUPS]


def test_train_help_node_prints_each_key_with_its_default_and_one_line():
    out = hybridflow("train", "--help", "actor_rollout_ref.rollout")
    assert out.returncode == 0, out.stderr
    body = [line for line in out.stdout.splitlines() if line.startswith("  ")]
    tree = defaults_tree()["actor_rollout_ref"]["rollout"]
    assert len(body) == len(_leaves(tree))
    for key, value in _leaves(tree):
        line = next(b for b in body if b.startswith(f"  {key} = "))
        assert line.startswith(f"  {key} = {format_value(value)}   ") and len(line.split("   ", 1)[1]) > 3
    assert "  n = 1   responses sampled per prompt." in body
    assert "  name = hf   hf is the built-in engine" in out.stdout


@pytest.mark.parametrize("module", ["hybridflow", "hybridflow.trainer.main_ppo"])
def test_help_of_one_key_and_through_verls_module_path(module):
    args = ("train", "--help", "data.train_batch_size") if module == "hybridflow" else ("--help", "data.train_batch_size")
    out = hybridflow(*args, module=module)
    assert out.returncode == 0 and out.stdout.startswith("data.train_batch_size = 1024   prompts per step"), out


def test_an_unknown_node_is_one_line_naming_the_closest():
    out = hybridflow("train", "--help", "actor_rollout_ref.rolout")
    assert out.returncode == 2 and not out.stdout
    assert out.stderr.strip().splitlines() == [
        "hybridflow train: no config key or node 'actor_rollout_ref.rolout'; did you mean "
        "'actor_rollout_ref.rollout'? (the groups: hybridflow train --help)"]


HELP_CASES = {  # command line -> words its help must show (its options)
    ("sft", "--help"): ("data.train_files", "model.partial_pretrain", "trainer.total_training_steps"),
    ("quickstart", "--help"): ("--task", "--output-dir", "--seed", "--max-seconds", "--backend"),
    ("generate", "--help"): ("data.val_files", "actor_rollout_ref.model.path", "val_kwargs"),
    ("eval", "-h"): ("usage: hybridflow eval", "data.val_files"),
    ("merge", "--help"): ("local_dir", "target_dir"),
    ("data", "--help"): ("gsm8k", "math", "countdown", "synthetic"),
    ("data", "gsm8k", "--help"): ("--input", "--local-dir", "--tool"),
    ("sandbox", "--help"): ("serve", "check", "--port"),
    ("report", "--help"): ("run_dir", "--serve", "--port", "--refresh"),
    ("--help",): ("train", "sft", "quickstart", "generate", "merge", "data", "sandbox", "report"),
}


@pytest.mark.parametrize("argv", list(HELP_CASES), ids=" ".join)
def test_every_command_answers_help_with_its_options(argv):
    out = hybridflow(*argv)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    for word in HELP_CASES[argv]:
        assert word in out.stdout, f"{' '.join(argv)}: {word!r} missing from\n{out.stdout}"
