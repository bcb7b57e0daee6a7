"""Reward rules that need no files: where and when the batch is scored."""

from __future__ import annotations

from hybridflow.config.schema import PPOConfig

__all__ = ["PER_SAMPLE_REWARD_MANAGERS", "check_async_reward", "check_reward_manager"]

# reward managers the agent loops' reward loop can run per trajectory (hybridflow.agents.reward_loop)
PER_SAMPLE_REWARD_MANAGERS = ("naive", "dapo", "prime")


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
    from hybridflow.rewards.managers import REWARD_MANAGERS

    if rm.reward_manager not in REWARD_MANAGERS:
        errors.append(f"reward_model.reward_manager={rm.reward_manager!r}: "
                      f"{REWARD_MANAGERS.unknown_message(rm.reward_manager)} (a manager of your own: register it with "
                      "@REWARD_MANAGERS.register(name) from hybridflow.rewards, in a module listed in "
                      "trainer.import_modules)")


def check_async_reward(cfg: PPOConfig, errors: list[str]) -> None:
    if not cfg.reward_model.launch_reward_fn_async:
        return
    key = "reward_model.launch_reward_fn_async=true"
    if cfg.algorithm.filter_groups.enable:
        errors.append(f"{key} scores while the log-prob passes run, but algorithm.filter_groups (DAPO dynamic "
                      "sampling) needs the scores before the batch exists, to choose its groups: use one or the other")
    if cfg.reward_model.enable:
        errors.append(f"{key} runs the reward *function* in the background; with reward_model.enable=true the scores "
                      "come from the reward-model worker group instead, so there is nothing to launch: drop one")
    elif cfg.reward_model.use_reward_loop and cfg.reward_model.reward_manager in PER_SAMPLE_REWARD_MANAGERS:
        errors.append(f"{key} scores the batch in the background after generation, but reward_model.use_reward_loop"
                      f"=true (the default) with the {cfg.reward_model.reward_manager} manager already scores every "
                      "trajectory while generation runs: set reward_model.use_reward_loop=false to score in the "
                      "background instead, or drop launch_reward_fn_async")
