"""The rules of ``trainer.use_v1`` / ``trainer.v1.*`` (verl 0.9's V1 trainer): one step of the configuration stage.

Every key of the node acts in the mode that reads it or is refused here with the reason; the typed reading of
the node (defaults, :class:`~hybridflow.config.v1.V1Settings`) is :mod:`hybridflow.config.v1`.
"""

from __future__ import annotations

import os

from hybridflow.config.v1 import (
    MODE_OF_KEY,
    V1_DEFAULTS,
    V1_MODES,
    V1_STRATEGIES,
    V1Settings,
    flatten_node,
    v1_node,
    v1_settings,
)

__all__ = ["check_v1_config"]


def check_v1_config(cfg, errors: list[str], notes: list[str]) -> None:
    """Append the problems of ``trainer.use_v1`` / ``trainer.v1.*`` to ``errors`` (see the module docstring)."""
    node = v1_node(cfg)
    flat, defaults = flatten_node(node), flatten_node(V1_DEFAULTS)
    for key in sorted(set(flat) - set(defaults)):
        from hybridflow.utils.registry import closest

        hint = closest(key, list(defaults))
        errors.append(f"trainer.v1.{key}: verl's V1 node has no such key" + (f" (did you mean trainer.v1.{hint}?)"
                                                                             if hint else ""))
    changed = sorted(k for k in defaults if k in flat and flat[k] != defaults[k])
    if not bool(getattr(cfg.trainer, "use_v1", False)):
        for key in changed:
            errors.append(f"trainer.v1.{key}={flat[key]!r} acts in verl's V1 trainer only: set trainer.use_v1=true, "
                          "or remove the key")
        return
    mode = str(node["trainer_mode"])
    if mode not in V1_MODES:
        errors.append(f"trainer.v1.trainer_mode={mode!r}; choose one of: {', '.join(V1_MODES)}")
        return
    for key in changed:
        modes = MODE_OF_KEY.get(key)
        if key.startswith(("colocate_async.", "separate_async.")) and key.split(".")[0] != mode and modes is None:
            modes = (key.split(".")[0],)
        if modes is not None and mode not in modes:
            errors.append(f"trainer.v1.{key}={flat[key]!r} acts in trainer_mode={' / '.join(modes)} only (this run: "
                          f"{mode}); remove the key" + (" -- synchronous sampling is on-policy, nothing gets stale"
                                                        if mode == "sync" and "off_policy" in key else ""))
    settings = v1_settings(cfg)
    _check_sampler(cfg, settings, errors)
    if mode == "colocate_async":
        _check_colocate(cfg, settings, errors)
    elif mode == "separate_async":
        _check_separate(cfg, settings, flat, errors)
    if mode != "sync":
        _check_async_common(cfg, settings, errors, notes)


def _check_sampler(cfg, v1: V1Settings, errors: list[str]) -> None:
    s = v1.sampler
    if s.max_off_policy_threshold < 1:
        errors.append(f"trainer.v1.sampler.max_off_policy_threshold={s.max_off_policy_threshold}: must be an integer "
                      ">= 1 (1: every group is trained in the step it was submitted)")
    if s.max_off_policy_strategy not in V1_STRATEGIES:
        errors.append(f"trainer.v1.sampler.max_off_policy_strategy={s.max_off_policy_strategy!r}; choose drop (evict "
                      "and refill groups past the threshold) or wait (block until in-flight groups reaching it finish)")
    if bool(s.custom_sampler_path) != bool(s.custom_sampler_name):
        errors.append("trainer.v1.sampler.custom_sampler needs both path (a .py file) and name (a ReplayBuffer "
                      "subclass in it)")
    elif s.custom_sampler_path and not os.path.isfile(os.path.expanduser(str(s.custom_sampler_path))):
        errors.append(f"trainer.v1.sampler.custom_sampler.path={s.custom_sampler_path!r}: no such file")
    if s.sampler_kwargs and not s.custom_sampler_path:
        errors.append("trainer.v1.sampler.sampler_kwargs are passed to a custom sampler's constructor; set "
                      "trainer.v1.sampler.custom_sampler.{path,name}, or remove them")
    if v1.mode == "sync" and s.sync_refill_failed_groups and float(cfg.trainer.tolerated_failure_fraction) <= 0:
        errors.append("trainer.v1.sampler.sync_refill_failed_groups=true replaces failed groups, but "
                      "trainer.tolerated_failure_fraction=0 stops the run at the first failure; raise it")


def _check_colocate(cfg, v1: V1Settings, errors: list[str]) -> None:
    arr = cfg.actor_rollout_ref
    if not arr.hybrid_engine:
        errors.append("trainer.v1.trainer_mode=colocate_async runs rollout and training on the same devices: set "
                      "actor_rollout_ref.hybrid_engine=true (separate_async is the mode with a rollout pool of its "
                      "own)")
    if arr.rollout.name != "hf":
        errors.append(f"trainer.v1.trainer_mode=colocate_async with actor_rollout_ref.rollout.name={arr.rollout.name}: "
                      "interrupting generation for the update and continuing it on the new weights is built for the "
                      "colocated hf engine in this version; use rollout.name=hf, or trainer_mode=sync")
    if v1.num_warmup_batches < 0:
        errors.append("trainer.v1.colocate_async.num_warmup_batches must be >= 0")


def _check_separate(cfg, v1: V1Settings, flat: dict, errors: list[str]) -> None:
    arr = cfg.actor_rollout_ref
    mini = int(arr.actor.ppo_mini_batch_size)
    tb = int(cfg.data.train_batch_size)
    if v1.parameter_sync_step < 1:
        errors.append("trainer.v1.separate_async.parameter_sync_step must be >= 1")
    elif tb != v1.parameter_sync_step * mini:
        errors.append(f"data.train_batch_size={tb}: separate_async trains one PPO mini-batch at a time and pushes the "
                      f"weights after trainer.v1.separate_async.parameter_sync_step={v1.parameter_sync_step} of them, so "
                      f"the batch must be parameter_sync_step x actor.ppo_mini_batch_size = "
                      f"{v1.parameter_sync_step * mini} (as verl asserts)")
    if arr.hybrid_engine:
        errors.append("trainer.v1.trainer_mode=separate_async generates on rollout replicas of their own: set "
                      "actor_rollout_ref.hybrid_engine=false and size the pool with rollout.nnodes / "
                      "rollout.n_gpus_per_node (colocate_async shares the training devices)")
    elif arr.rollout.name != "hf":
        errors.append(f"trainer.v1.trainer_mode=separate_async with actor_rollout_ref.rollout.name={arr.rollout.name}: "
                      "continuing interrupted trajectories on the new weights (V1's partial rollout) is done by the "
                      "standalone hf replicas in this version; set rollout.name=hf")
    if v1.num_warmup_batches < 0:
        errors.append("trainer.v1.separate_async.num_warmup_batches must be >= 0")
    if arr.rollout.free_cache_engine:
        errors.append("actor_rollout_ref.rollout.free_cache_engine=true: separate_async replicas generate without "
                      "pause, so their KV cache is never free to release; set it to false")
    switch = {k: v for k, v in flat.items() if k.startswith("separate_async.hybrid_rollout.")}
    if switch.get("separate_async.hybrid_rollout.enable_switch"):
        errors.append("trainer.v1.separate_async.hybrid_rollout.enable_switch=true lends the trainer's idle devices "
                      "to generation; in this version the trainer's processes host no rollout engine in "
                      "separate_async, so there is nothing to lend. Balance the pools (rollout.n_gpus_per_node vs "
                      "trainer.n_gpus_per_node), or use colocate_async")
    else:
        defaults = flatten_node(V1_DEFAULTS)
        for key, value in sorted(switch.items()):
            if key.endswith("enable_switch") or value == defaults.get(key):
                continue
            errors.append(f"trainer.v1.{key}={value!r} tunes the trainer-to-rollout switch, which is off "
                          "(hybrid_rollout.enable_switch=false); remove the key")


def _check_async_common(cfg, v1: V1Settings, errors: list[str], notes: list[str]) -> None:
    s = v1.sampler
    if s.max_off_policy_strategy == "wait" and s.max_off_policy_threshold < v1.num_warmup_batches + 1:
        errors.append(f"trainer.v1.sampler.max_off_policy_strategy=wait with max_off_policy_threshold="
                      f"{s.max_off_policy_threshold} and num_warmup_batches={v1.num_warmup_batches}: the warm-up "
                      f"batches keep {v1.num_warmup_batches} batch(es) queued ahead, so groups reach age "
                      f"{v1.num_warmup_batches + 1} while waiting their turn and 'wait' never drops one; raise the "
                      f"threshold to >= {v1.num_warmup_batches + 1}, lower num_warmup_batches, or use drop")
    fg = cfg.algorithm.filter_groups
    if fg.enable and cfg.reward_model.enable:
        errors.append("algorithm.filter_groups.enable=true in an async V1 mode classifies groups as they finish, "
                      "with the rule reward; a reward model scores only after sampling (as verl requires: "
                      "streaming reward). Use a reward function, or trainer_mode=sync")
    if cfg.reward_model.launch_reward_fn_async:
        errors.append("reward_model.launch_reward_fn_async=true overlaps scoring with the old-log-prob pass of the "
                      "synchronous step; the async V1 modes score each group as it is sampled. Remove the key")
    if cfg.algorithm.adv_estimator == "remax":
        errors.append("algorithm.adv_estimator=remax draws a greedy baseline with the batch's weights, which an async "
                      "V1 batch (groups of several versions) does not have; use trainer_mode=sync")
    gen = cfg.data.gen_batch_size
    if gen and int(gen) not in (1, int(cfg.data.train_batch_size)):
        notes.append(f"data.gen_batch_size={gen}: the async V1 modes submit prompts one group at a time (verl sets "
                     "gen_batch_size=1); the loader's batch only sets how many rows are read at once")
