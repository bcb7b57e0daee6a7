"""Other spellings of keys: old verl names, and verl 0.9's moved keys, mapped to the one key the code reads.

Used by the loader (rewriting overrides and config files) and by the key policy (which keys verl 0.9 added are
aliases); kept apart so that both can import it.
"""

from __future__ import annotations

__all__ = ["KEY_ALIASES", "PATH_ALIASES", "canonical_key"]

# Old verl spellings still found in published launch scripts -> the current spelling. The key is the
# trailing part of an override path (a leaf name, or a dotted tail when the rename moved the key to
# another node); the value replaces that tail.
KEY_ALIASES = {
    "use_rmpad": "use_remove_padding",
    # verl's first profiler options sat on each role and on the trainer; they moved under <role>.profiler
    # and global_profiler (all accepted, and ignored, here).
    "profile_ranks": "profiler.ranks",
    "profile_ranks_all": "profiler.all_ranks",
    "profile_discrete": "profiler.tool_config.nsys.discrete",
    "trainer.profile_steps": "global_profiler.steps",
    # the sandbox URL became a node of its own (url, max_concurrent, memory_limit_mb)
    "reward_model.sandbox_fusion_url": "reward_model.sandbox_fusion.url",
    # the OTB example script spells the switch with "compute"; verl's actor config calls it "calculate"
    "actor.compute_sum_pi_squared": "actor.calculate_sum_pi_squared",
    # SAPO's temperatures live on the actor node (verl reads actor.tau_pos); verl 0.9's SAPO scripts add them
    # under policy_loss
    "actor.policy_loss.tau_pos": "actor.tau_pos",
    "actor.policy_loss.tau_neg": "actor.tau_neg",
}

# verl 0.9 (Aug 2026) moved the reward settings under one ``reward`` node and the critic's engine settings to
# ``critic.fsdp``; hybridflow keeps the early-2026 tree as the one place the code reads (the FSDP reward-model
# worker's settings exist only there), and reads verl 0.9's spelling into it. Prefixes: a key under the left
# node lands under the right one. Longest prefix first.
PATH_ALIASES = {
    "reward.custom_reward_function": "custom_reward_function",
    "reward.reward_manager.name": "reward_model.reward_manager",
    "reward.reward_manager.source": "reward_model.reward_loop_source",
    "reward.reward_manager.module.path": "reward_model.reward_loop_module_path",
    "reward.reward_manager.module.name": "reward_model.reward_loop_class_name",
    "reward.reward_model.model_path": "reward_model.model.path",
    "reward.reward_model": "reward_model",
    "reward.sandbox_fusion": "reward_model.sandbox_fusion",
    "reward.reward_kwargs": "reward_model.reward_kwargs",
    "reward.num_workers": "reward_model.num_workers",
    "sandbox_fusion": "reward_model.sandbox_fusion",  # verl 0.9's deprecated top-level spelling
    "critic.fsdp": "critic.model.fsdp_config",
    # verl 0.9's engine-level spelling of a role's Ulysses size (the same setting)
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size":
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size":
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
}
_PATH_ALIASES_LONGEST_FIRST = sorted(PATH_ALIASES.items(), key=lambda kv: -len(kv[0]))


def canonical_key(key: str) -> str:
    """The spelling hybridflow reads for an override key (``key`` itself when it is already that spelling)."""
    for old, new in _PATH_ALIASES_LONGEST_FIRST:
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    parts = key.split(".")
    for old, new in KEY_ALIASES.items():
        old_parts = old.split(".")
        if parts[-len(old_parts):] == old_parts:
            return ".".join(parts[:-len(old_parts)] + new.split("."))
    return key
