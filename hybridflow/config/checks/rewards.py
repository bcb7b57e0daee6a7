"""Reward rules that need no files: where and when the batch is scored."""

from __future__ import annotations

from hybridflow.config.schema import PPOConfig

__all__ = ["PER_SAMPLE_REWARD_MANAGERS", "check_async_reward"]

# reward managers the agent loops' reward loop can run per trajectory (hybridflow.agents.reward_loop)
PER_SAMPLE_REWARD_MANAGERS = ("naive", "dapo", "prime")


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
