"""A training run with ``reward_model.launch_reward_fn_async=true`` scores in a background thread and ends with
exactly the metrics of the same run scored in line."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run, small_overrides

A = "actor_rollout_ref"
REWARD = [f"custom_reward_function.path={Path(__file__).with_name('reward_fns.py')}",
          "custom_reward_function.name=compute_score_thread", "reward_model.num_workers=0",
          "reward_model.use_reward_loop=false"]  # the trainer scores (the agent loops' reward loop is another path)
# KL loss brings a reference pass and two mini-batches bring an old-log-prob pass: stages the scoring overlaps
ALGO = ["algorithm.adv_estimator=grpo", f"{A}.actor.use_kl_loss=true"]


@pytest.mark.slow
def test_background_scoring_gives_the_same_run(nano_model_dir, addition_data, tmp_path, monkeypatch):
    import threading

    from hybridflow.rewards.managers import RewardManager

    callers: dict[str, list[bool]] = {"false": [], "true": []}  # did the trainer's thread call the manager?
    flag_now = {"flag": "false"}
    real_call = RewardManager.__call__

    def recording_call(self, data, return_dict=False):
        if self.num_examine == 0:  # the training manager (validation scores in line in both runs)
            callers[flag_now["flag"]].append(threading.current_thread() is threading.main_thread())
        return real_call(self, data, return_dict)

    monkeypatch.setattr(RewardManager, "__call__", recording_call)
    histories = {}
    for flag in ("false", "true"):
        flag_now["flag"] = flag
        out = tmp_path / flag
        extra = [*REWARD, *ALGO, f"reward_model.launch_reward_fn_async={flag}"]
        histories[flag] = [m for m in run(small_overrides(nano_model_dir, addition_data, out, extra=extra), out).metrics
                           if "timing_s/step" in m]
    sync, background = histories["false"], histories["true"]
    assert callers["false"] == [True, True] and callers["true"] == [False, False], callers
    for a, b in zip(sync, background):
        for key in ("critic/score/mean", "critic/advantages/max", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm",
                    "reward_extra/acc/mean", "response_length/mean"):
            assert a[key] == b[key], key
        # (exact log-probs, CPU's default, skip the old_log_prob pass: the scoring overlaps the reference pass)
        assert "timing_s/ref" in b and "timing_s/reward" in b
