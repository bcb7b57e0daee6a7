"""``--help`` of the commands that take ``key=value`` overrides: ``train`` (and ``python -m
hybridflow.trainer.main_ppo``), ``generate`` / ``eval`` and ``sft``.

``hybridflow train --help`` lists the options and the config groups; ``hybridflow train --help NODE`` (a group, a
node inside one, or one key) prints every key under it with its default and one line, from the config reference
(:mod:`hybridflow.cli.config_reference`, the source of ``docs/config.md``'s tables). Nothing heavy is imported.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["format_value", "generate_help", "sft_help", "train_help", "wants_help"]

HELP_FLAGS = ("-h", "--help")

TRAIN_USAGE = """usage: hybridflow train [--dry-run] [--config-path DIR --config-name NAME] key=value ...
       hybridflow train --help [NODE]
       (the same as: python -m hybridflow.trainer.main_ppo ...)

PPO / GRPO / DAPO / ... training with verl's config keys and Hydra's override grammar:
  a.b=v   set a key            +a.b=v / ++a.b=v   add or override        ~a.b   delete a key you added
  a.b=[x,y]  a list            a.b=null           null

options:
  --dry-run                 run every check of the pipeline, print the resolved config and what one step
                            does with your numbers, then exit (0: valid; 2: every problem, naming the key)
  --config-path DIR         a folder of your own YAML configs (also --config_path, -cp)
  --config-name NAME        the config to compose from it (also --config_name, -cn); the built-in ones:
                            ppo_trainer (default), dapo_trainer, one_step_off_ppo_trainer,
                            fully_async_ppo_trainer, prime_trainer, spin_trainer, sppo_trainer
  -h, --help [NODE]         this text; with NODE (e.g. actor_rollout_ref.rollout, data.train_batch_size):
                            every key under it with its default and what it does

config groups (hybridflow train --help GROUP):
"""

TRAIN_FOOTER = """

Check a command line before starting: hybridflow train --dry-run key=value ...
Every key, with the check pipeline and the error messages: docs/config.md; batch sizes: docs/batch-sizes.md."""


def wants_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


def _help_target(argv: list[str]) -> str | None:
    """The NODE after ``--help`` (``--help NODE`` or ``--help=NODE``), or None."""
    for i, arg in enumerate(argv):
        if arg.startswith("--help="):
            return arg.split("=", 1)[1] or None
        if arg in HELP_FLAGS and i + 1 < len(argv) and "=" not in argv[i + 1] and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None


def format_value(value: Any) -> str:
    """A default as a command line would write it (``null``, ``true``, ``[console]``, ``${data.seed}``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _groups_text() -> str:
    from hybridflow.cli.config_reference import GROUPS

    width = max(len(name) for name, _ in GROUPS) + 2
    return "\n".join(f"  {name:<{width}}{text}" for name, text in GROUPS)


def node_text(node: str) -> str:
    """Every key under ``node`` with its default and one line; ``KeyError`` for a node that does not exist."""
    from hybridflow.cli.config_reference import key_lines

    lines = key_lines(node)
    tail = ["", "More in docs/config.md; check a command line with hybridflow train --dry-run."]
    if len(lines) == 1 and lines[0].key == node.rsplit(".", 1)[-1]:  # one key
        return "\n".join([f"{node} = {format_value(lines[0].default)}   {lines[0].line}", *tail])
    head = f"{node}: {len(lines)} keys, as `key = default   what it does` (set one with {node}.KEY=VALUE)"
    return "\n".join([head, *(f"  {kl.key} = {format_value(kl.default)}   {kl.line}" for kl in lines), *tail])


def _unknown_node(node: str, prog: str) -> int:
    from hybridflow.cli.config_reference import defaults_tree
    from hybridflow.utils.registry import closest

    def nodes(tree: Any, prefix: str) -> list[str]:
        out = []
        for k, v in tree.items() if isinstance(tree, dict) else ():
            path = f"{prefix}.{k}" if prefix else str(k)
            out += [path, *nodes(v, path)]
        return out

    hint = closest(node, nodes(defaults_tree(), ""))
    print(f"{prog}: no config key or node '{node}'" + (f"; did you mean '{hint}'?" if hint else "")
          + f" (the groups: {prog} --help)", file=sys.stderr)
    return 2


def train_help(argv: list[str], prog: str = "hybridflow train") -> int:
    """Print ``train``'s help (or a node's keys) and return the exit code (0; 2 for an unknown node)."""
    node = _help_target(argv)
    if node is None:
        print(TRAIN_USAGE.replace("hybridflow train", prog, 2) + _groups_text() + TRAIN_FOOTER)
        return 0
    try:
        print(node_text(node))
    except KeyError:
        return _unknown_node(node, prog)
    return 0


GENERATE_USAGE = """usage: hybridflow {cmd} key=value ...
       hybridflow {cmd} --help [NODE]

Generate for every prompt of data.val_files with a model and score the answers, exactly as the trainer's
validation does (same worker groups, rollout engine, reward manager; metrics named val-core/...).
Generations are written as JSONL to trainer.validation_data_dir.

It takes the training keys (hybridflow train --help NODE lists them); the ones that matter:
  actor_rollout_ref.model.path              the model (a local Hugging Face folder)
  data.val_files                            the prompts (verl-format parquet / json)
  data.max_prompt_length, data.max_response_length
  actor_rollout_ref.rollout.name            hf (default) | vllm | sglang
  actor_rollout_ref.rollout.val_kwargs.*    sampling: temperature, top_k, top_p, n, do_sample
  reward_model.*, custom_reward_function.*  how answers are scored
  trainer.backend, trainer.device, trainer.validation_data_dir

options:
  --config-path DIR --config-name NAME      compose your own YAML (as hybridflow train)
  -h, --help [NODE]                         this text; with NODE, every key under it (as hybridflow train --help)
"""


def generate_help(argv: list[str], cmd: str = "generate") -> int:
    if _help_target(argv) is not None:
        return train_help(argv, prog=f"hybridflow {cmd}")
    print(GENERATE_USAGE.format(cmd=cmd))
    return 0


def sft_help(argv: list[str]) -> int:
    """``hybridflow sft --help``: its keys (verl's sft_trainer.yaml names) with their defaults."""
    from omegaconf import OmegaConf

    from hybridflow.sft.config import SFTConfig

    tree = OmegaConf.to_container(OmegaConf.structured(SFTConfig))
    node = _help_target(argv)
    if node is not None:
        for part in node.split("."):
            if not isinstance(tree, dict) or part not in tree:
                print(f"hybridflow sft: no config key or node '{node}' (the keys: hybridflow sft --help)",
                      file=sys.stderr)
                return 2
            tree = tree[part]

    def leaves(t: Any, prefix: str) -> list[str]:
        if isinstance(t, dict) and t:
            return [line for k, v in t.items() for line in leaves(v, f"{prefix}.{k}" if prefix else k)]
        return [f"  {prefix} = {format_value(t)}"]

    print("usage: hybridflow sft key=value ...   (the same as: python -m hybridflow.trainer.fsdp_sft_trainer ...)\n"
          "       hybridflow sft --help [NODE]\n\n"
          "Supervised fine-tuning with verl's fsdp_sft_trainer keys (prompt/response columns, or chat messages with\n"
          "data.multiturn.enable=true); writes a Hugging Face folder to trainer.default_local_dir/huggingface.\n"
          "What each key does: docs/commands.md#sft.\n\n"
          f"keys{' under ' + node if node else ''} (key = default):")
    print("\n".join(leaves(tree, node or "")))
    return 0
