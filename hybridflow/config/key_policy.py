"""What every accepted verl key does here, for the keys that need saying: refused values and inert keys.

Every key of ``ppo_trainer.yaml`` either acts, or is listed here:

* ``REFUSED``: a key whose non-default value asks for something hybridflow does not do.  Setting it is a
  configuration error (exit 2) naming the key and why, instead of a run that silently does something else.
* ``INERT``: a key that cannot mean anything here (storage systems, profilers, kernel libraries, options of
  FSDP1 or of machinery hybridflow does not have).  They are accepted so verl command lines run unchanged; the
  ones a command line sets are printed together in one note at start, and all of them form the table in
  ``docs/migrating-from-verl.md`` (``tests/config/test_key_policy.py`` keeps the two equal).

The accepted (REFUSED) or quiet (INERT) value of a key is its default in ``ppo_trainer.yaml``.  Keys are written
with ``{a,b}`` alternatives, expanded by :func:`expand`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["KeyRule", "REFUSED", "INERT", "expand", "default_of", "refusal_errors", "inert_note",
           "inert_keys_markdown", "refused_keys_markdown"]

_FSDP = "{actor_rollout_ref.actor,actor_rollout_ref.ref,critic.model,reward_model.model}.fsdp_config"
_FROZEN = "{actor_rollout_ref.ref,reward_model.model}.fsdp_config"


@dataclass(frozen=True)
class KeyRule:
    key: str
    reason: str


REFUSED: tuple[KeyRule, ...] = (
    KeyRule("{actor_rollout_ref.actor,critic}.checkpoint.async_save",
            "asynchronous checkpoint saving is a Megatron-only feature in verl; hybridflow writes checkpoints "
            "synchronously and atomically"),
    KeyRule("actor_rollout_ref.rollout.skip_rollout",
            "verl's rollout dump-and-replay debugging aid (skip_rollout, skip_dump_dir) is not implemented; "
            "trainer.rollout_data_dir writes every step's generations"),
    KeyRule("actor_rollout_ref.rollout.trace.backend",
            "rollout tracing to Weave or MLflow is not implemented; trainer.rollout_data_dir and "
            "trainer.validation_data_dir write every trajectory, and the run report shows samples"),
    KeyRule("actor_rollout_ref.rollout.over_sample_rate",
            "cutting the slowest tail of a generation (over-sampling) is not implemented; every trajectory of a step "
            "runs to its end (use the fully async mode with partial rollouts for long-tail lengths)"),
    KeyRule("data.return_raw_chat",
            "the rollout renders prompts from the chat messages, so hybridflow always keeps them (verl's async "
            "rollout needs return_raw_chat=true as well)"),
)

INERT: tuple[KeyRule, ...] = (
    KeyRule("actor_rollout_ref.rollout.trace.{token2text,max_samples_per_step_per_worker}",
            "options of verl's rollout tracing, which is refused (rollout.trace.backend)"),
    KeyRule("{data,actor_rollout_ref.model,critic.model,reward_model.model}.use_shm",
            "copies files fetched from HDFS into /dev/shm; hybridflow reads local folders and hub names in place"),
    KeyRule("trainer.default_hdfs_dir", "HDFS upload of checkpoints (no HDFS client here)"),
    KeyRule("trainer.del_local_ckpt_after_load",
            "deletes the local copy verl downloaded from HDFS; hybridflow resumes from the checkpoint folder in place "
            "and never deletes it"),
    KeyRule("trainer.esi_redundant_time",
            "saving before a Volcano Engine ESI (elastic instance) expires; no such platform here"),
    KeyRule("global_profiler", "verl's nsys / NPU / torch profiler hooks: profile with torch.profiler or py-spy"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref,actor_rollout_ref.rollout,critic,reward_model}.profiler",
            "per-role profiler hooks (see global_profiler)"),
    KeyRule("actor_rollout_ref.model.use_liger",
            "Liger GPU kernels (not shipped); they compute the same numbers as the plain modules"),
    KeyRule("{actor_rollout_ref.model,actor_rollout_ref.actor,reward_model.model}.use_fused_kernels",
            "verl's fused Triton / NPU log-prob kernels (not shipped); hybridflow's chunked kernel, compiled under "
            "use_torch_compile, computes the same numbers"),
    KeyRule("actor_rollout_ref.model.fused_kernel_options.impl_backend",
            "backend of verl's fused kernels (see use_fused_kernels)"),
    KeyRule("{actor_rollout_ref.actor,actor_rollout_ref.ref}.entropy_from_logits_with_chunking",
            "the entropy is always computed 2048 rows at a time here: the same numbers with bounded memory"),
    KeyRule(f"{_FSDP}.wrap_policy.min_num_params",
            "FSDP1's size-based auto-wrap; FSDP2 shards per decoder layer (verl's FSDP2 path ignores it too)"),
    KeyRule(f"{_FSDP}.use_orig_params", "an FSDP1 flag; FSDP2 always keeps the original parameters (as DTensors)"),
    KeyRule(f"{_FSDP}.grad_offload", "deprecated in verl and ignored there"),
    KeyRule(f"{_FROZEN}.optimizer_offload", "the reference / reward model has no optimizer"),
    KeyRule(f"{_FROZEN}.mixed_precision.reduce_dtype", "the reference / reward model has no gradients to reduce"),
    KeyRule(f"{_FROZEN}.seed", "a frozen model loaded from a checkpoint draws no random numbers"),
    KeyRule("{actor_rollout_ref.ref,critic.model,reward_model.model}.fsdp_config.entropy_checkpointing",
            "that model computes no entropy"),
    KeyRule("actor_rollout_ref.ref.entropy_checkpointing", "the reference computes no entropy"),
    KeyRule("data.{tokenizer,return_raw_input_ids,trust_remote_code,datagen.path,datagen.name}",
            "not read by verl's trainer either (the tokenizer comes from actor_rollout_ref.model)"),
    KeyRule("data.filter_overlong_prompts_workers",
            "process count of verl's datasets-based length filter; hybridflow's filter tokenises each prompt once in "
            "the driver and reuses the ids for the items"),
    KeyRule("{actor_rollout_ref.actor,critic}.optim.total_training_steps",
            "filled by the trainer from trainer.total_training_steps or the epochs (verl overwrites it too)"),
    KeyRule("trainer.use_legacy_worker_impl", "hybridflow has one worker implementation"),
    KeyRule("actor_rollout_ref.rollout.skip_dump_dir", "only read with rollout.skip_rollout, which is refused"),
)


def expand(pattern: str) -> list[str]:
    """``a.{b,c}.d`` -> ``["a.b.d", "a.c.d"]`` (several groups multiply)."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    end = pattern.index("}", start)
    return [x for alt in pattern[start + 1:end].split(",")
            for x in expand(pattern[:start] + alt.strip() + pattern[end + 1:])]


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


@lru_cache(maxsize=1)
def _defaults() -> dict:
    from pathlib import Path

    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(Path(__file__).with_name("ppo_trainer.yaml")), resolve=True)


def default_of(key: str) -> Any:
    """The key's value in ``ppo_trainer.yaml`` (interpolations resolved)."""
    return _get(_defaults(), key)


def _set_keys(cfg: Any, rules: tuple[KeyRule, ...]) -> list[tuple[str, Any, KeyRule]]:
    return [(key, _get(cfg, key), rule) for rule in rules for key in expand(rule.key)
            if _get(cfg, key) != default_of(key)]


def refusal_errors(cfg: Any) -> list[str]:
    """One error per refused key set to a value other than the one hybridflow supports (its default)."""
    return [f"{key}={value!r} is not supported: {rule.reason}" for key, value, rule in _set_keys(cfg, REFUSED)]


def inert_note(cfg: Any) -> str | None:
    """One grouped note naming every inert key the command line set (``None`` when there is none)."""
    hits = [f"  {key}={value!r}: {rule.reason}" for key, value, rule in _set_keys(cfg, INERT)]
    if not hits:
        return None
    return ("these keys have no effect in hybridflow (table: docs/migrating-from-verl.md, 'Keys without effect'):\n"
            + "\n".join(hits))


def inert_keys_markdown() -> str:
    """The table of ``docs/migrating-from-verl.md``: one row per rule."""
    rows = ["| key | why it has no effect here |", "|---|---|"]
    rows += [f"| {', '.join(f'`{k}`' for k in expand(rule.key))} | {rule.reason} |" for rule in INERT]
    return "\n".join(rows)


def refused_keys_markdown() -> str:
    """The refused keys of ``docs/migrating-from-verl.md``: key, the only accepted value, why."""
    rows = ["| key | accepted value | why other values are refused |", "|---|---|---|"]
    for rule in REFUSED:
        keys = expand(rule.key)
        rows.append(f"| {', '.join(f'`{k}`' for k in keys)} | `{default_of(keys[0])!r}` | {rule.reason} |")
    return "\n".join(rows)

