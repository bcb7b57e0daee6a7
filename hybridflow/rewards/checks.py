"""This floor's configuration rules, run by the launch's check pipeline: the reward manager is registered (config
stage), and every user object the run will load -- the reward function and its signature, a manager class from a
file, the dataset and sampler classes, a model's ``external_lib`` -- loads (run stage)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridflow.rewards.custom_function import RewardFunctionError
from hybridflow.rewards.manager_factory import check_reward_function
from hybridflow.rewards.managers import REWARD_MANAGERS, RewardManager
from hybridflow.utils.load_object import LoadObjectError, UserObjectNotFoundError, import_source, load_object

if TYPE_CHECKING:
    from hybridflow.config.schema import PPOConfig

__all__ = ["check_reward_manager", "check_user_code"]


def check_reward_manager(cfg: PPOConfig, errors: list[str]) -> None:
    """A registered manager name (user modules in trainer.import_modules may register more), or verl's
    ``reward.reward_manager.source=importlib`` with the file/module that holds the class (loaded in the run stage)."""
    rm = cfg.reward_model
    if rm.reward_loop_source == "importlib":
        if not rm.reward_loop_module_path:
            errors.append("reward.reward_manager.source=importlib loads the class reward.reward_manager.module.name "
                          "from reward.reward_manager.module.path, which is not set: give the file (path/to/file.py) "
                          "or module that defines it, or use source=register with reward.reward_manager.name")
        return
    if rm.reward_manager not in REWARD_MANAGERS:
        errors.append(f"reward_model.reward_manager={rm.reward_manager!r}: "
                      f"{REWARD_MANAGERS.unknown_message(rm.reward_manager)} (a manager of your own: register it with "
                      "@REWARD_MANAGERS.register(name) from hybridflow.rewards, in a module listed in "
                      "trainer.import_modules)")


def check_user_code(cfg, errors: list[str]) -> None:
    """Every user object the run will load: the reward function (and its signature), a reward manager class from a
    file, the dataset and sampler classes, a model's ``external_lib``."""
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
