"""Stage 2 of the check pipeline: the machine and the files the run will read, checked before any process starts.

Run by ``hybridflow train`` (``--dry-run`` included) and by ``train_ppo`` when the command line has not run it.
Each check reads only what it needs -- a model's ``config.json``, a data file's row count, the user's Python files
and YAMLs -- and never loads weights or starts Ray.  This is the one module of ``config/`` that asks the upper
floors about their own files (engine: model configs; rollout: what an engine can serve; agents / tools /
interactions: their YAMLs), each import local to its check, so importing the configuration never pulls them in.

The whole pipeline, in order, is :data:`PIPELINE` (stage 1 from :mod:`hybridflow.config.checks`, then
:data:`RUN_CHECKS`).
"""

from __future__ import annotations

import os
from typing import Any

from hybridflow.config.checks import CONFIG_CHECKS, Check, RunContext, run_checks
from hybridflow.config.checks.machine import check_rollout_hardware, check_rollout_precision
from hybridflow.config.checks.outputs import check_output_dirs
from hybridflow.utils.load_object import LoadObjectError, UserObjectNotFoundError, load_object

__all__ = ["PIPELINE", "RUN_CHECKS", "check_for_run", "checked_for_run"]


def check_model_files(cfg, errors: list[str]) -> None:
    """The actor's checkpoint is a causal LM (or a supported vision-language model) the rollout engine can serve;
    the critic's and the reward model's folders hold a model config. Reads ``config.json`` only."""
    from hybridflow.config.checks.machine import rollout_model_errors
    from hybridflow.engine.model_loader import ModelLoadError, check_causal_lm, load_hf_config

    model = cfg.actor_rollout_ref.model
    try:
        check_causal_lm(model.path, model.trust_remote_code)
    except ModelLoadError as e:
        errors.append(str(e))
        return
    errors.extend(rollout_model_errors(cfg))
    others = []
    if cfg.use_critic:
        others.append(("critic.model.path", cfg.critic.model.path, cfg.critic.model.trust_remote_code))
    if cfg.reward_model.enable:
        rm = cfg.reward_model.model
        others.append(("reward_model.model.path", rm.path, rm.trust_remote_code))
    for key, path, remote in others:
        try:
            load_hf_config(path, remote, None, key)
        except ModelLoadError as e:
            errors.append(str(e))


def check_data_files(cfg, errors: list[str]) -> None:
    """Every data file exists, and the training set holds at least one step's prompts (``drop_last``: a smaller
    set gives no batch at all). Counts rows (a parquet file's metadata; json is read) -- prompts filtered for length
    later (``data.filter_overlong_prompts``) are checked when the dataset is built."""
    from hybridflow.data.io import DataFileError, as_file_list, count_rows

    data = cfg.data
    for key, files, limit, need in (("data.train_files", data.train_files, data.train_max_samples,
                                     data.gen_batch_size or data.train_batch_size),
                                    ("data.val_files", data.val_files, data.val_max_samples, 1)):
        if files is None and key == "data.val_files":
            continue
        try:
            paths = as_file_list(files, key)
            counts = [count_rows(p) for p in paths]
        except DataFileError as e:
            errors.append(f"{key}: {e}")
            continue
        empty = [p for p, c in zip(paths, counts) if c == 0]
        if empty:
            errors.append(f"{key}: data file '{empty[0]}' contains no rows; check the preprocessing output")
            continue
        if any(c is None for c in counts):  # a hub dataset: its size is known once it downloads
            continue
        rows = sum(counts)
        usable = min(rows, limit) if limit is not None and limit > 0 else rows
        if usable < need:
            which = "data.gen_batch_size" if data.gen_batch_size and data.gen_batch_size != data.train_batch_size \
                else "data.train_batch_size"
            capped = f" (data.train_max_samples={limit})" if usable < rows else ""
            errors.append(f"{key}: {usable} training prompts{capped} is fewer than one step's {which}={need}, so the "
                          f"dataloader (drop_last) would yield no batch; lower {which} or add data")


def check_user_code(cfg, errors: list[str]) -> None:
    """Every user object the run will load: the reward function (and its signature), a reward manager class from a
    file, the dataset and sampler classes, a model's ``external_lib``."""
    from hybridflow.rewards.custom_function import RewardFunctionError
    from hybridflow.rewards.manager_factory import check_reward_function
    from hybridflow.rewards.managers import RewardManager

    crf, rm, data = cfg.custom_reward_function, cfg.reward_model, cfg.data
    jobs: list[tuple[str, Any]] = []
    if crf.path:
        jobs.append(("reward function", lambda: load_object(
            crf.path, name=crf.name or "compute_score", key="custom_reward_function.path", kind="reward function",
            expect=lambda fn: None if callable(fn) else f"is a {type(fn).__name__}, not a function")))
        jobs.append(("reward function signature", lambda: check_reward_function(cfg)))
    if rm.reward_loop_source == "importlib" and rm.reward_loop_module_path:
        jobs.append(("reward manager", lambda: load_object(
            rm.reward_loop_module_path, name=rm.reward_loop_class_name, key="reward.reward_manager.module.path",
            kind="reward manager class", expect=RewardManager)))
    for key, path, name in (("data.custom_cls.path", data.custom_cls.path, data.custom_cls.name),
                            ("data.sampler.class_path", data.sampler.class_path, data.sampler.class_name)):
        if path:
            jobs.append((key, lambda p=path, n=name, k=key: load_object(
                p, name=n, key=k, kind="class", expect=lambda c: None if isinstance(c, type) else "is not a class")))
    libs = [("actor_rollout_ref.model.external_lib", cfg.actor_rollout_ref.model.external_lib)]
    if cfg.use_critic:
        libs.append(("critic.model.external_lib", cfg.critic.model.external_lib))
    if rm.enable:
        libs.append(("reward_model.model.external_lib", rm.model.external_lib))
    from hybridflow.utils.load_object import import_source

    for key, lib in libs:
        if lib:
            jobs.append((key, lambda lib=lib, key=key: import_source(lib, key=key)))
    failed: set[str] = set()
    for what, job in jobs:
        if what == "reward function signature" and "reward function" in failed:
            continue  # the function did not load: that error is already listed
        try:
            job()
        except UserObjectNotFoundError as e:
            failed.add(what)
            fix = (f" (custom_reward_function.name={crf.name!r}: set it to one of them)" if what == "reward function"
                   else "")
            errors.append(f"{e}{fix}")
        except (LoadObjectError, RewardFunctionError) as e:
            failed.add(what)
            errors.append(str(e))


def check_optimizers(cfg, errors: list[str]) -> None:
    """``optim.optimizer_impl`` imports and ``optim.optimizer`` names an optimizer class in it (actor; critic when
    there is one) -- the engine's own rule (``engine/optim.py``), asked before any worker builds one."""
    from hybridflow.engine.optim import optimizer_class

    roles = [("actor_rollout_ref.actor.optim", cfg.actor_rollout_ref.actor.optim)]
    if cfg.use_critic:
        roles.append(("critic.optim", cfg.critic.optim))
    for field, optim in roles:
        try:
            optimizer_class(optim, field)
        except ValueError as e:
            errors.append(str(e))


def check_agent_files(cfg, errors: list[str]) -> None:
    """Agent-loop YAML, tool and interaction files, the tool-call format and the default agent loop (loaded, so
    every class they name is imported and built once here)."""
    from hybridflow.agents.setup_check import AgentConfigError, check_agent_config

    try:
        check_agent_config(cfg)
    except AgentConfigError as e:
        errors.append(str(e))


# Stage 2, in order: the device first (it decides what the rollout can do), then what each file must hold.
RUN_CHECKS: tuple[Check, ...] = (
    Check("rollout_hardware", check_rollout_hardware),    # engine keys that cannot act on this device
    Check("rollout_precision", check_rollout_precision),  # pi_old from the rollout needs the training precision
    Check("model_files", check_model_files),              # config.json: a causal LM the engine can serve
    Check("data_files", check_data_files),                # files exist, a step's prompts are there
    Check("user_code", check_user_code),                  # reward function + signature, classes, external_lib
    Check("optimizers", check_optimizers),                # optim.optimizer_impl / optimizer name a class
    Check("agent_files", check_agent_files),              # agent-loop / tool / interaction files
    Check("output_dirs", check_output_dirs),              # writable, room for the checkpoints kept
)

PIPELINE: tuple[Check, ...] = CONFIG_CHECKS + RUN_CHECKS


def check_for_run(cfg, logger_dir: str | os.PathLike | None = None) -> list[str]:
    """Stage 2 on a config that passed stage 1 (``load_config``); raises ``ConfigError`` with every problem.
    Marks the config so a later caller (``train_ppo`` after the command line ran it) does not repeat it."""
    notes = run_checks(cfg, RUN_CHECKS, RunContext(cfg, logger_dir=str(logger_dir) if logger_dir else None))
    cfg.__dict__["_checked_for_run"] = True
    return notes


def checked_for_run(cfg) -> bool:
    return bool(cfg.__dict__.get("_checked_for_run"))
