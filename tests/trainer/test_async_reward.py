"""``reward_model.launch_reward_fn_async``: scoring runs in the background while the next stages run, with the
same results as scoring in line (issue 15, item 1)."""

from __future__ import annotations

import threading

import pytest
import torch

from hybridflow.config import ConfigError
from hybridflow.launch.config import load_config
from hybridflow.protocol import DataProto
from hybridflow.trainer.async_reward import AsyncRewardScorer


def test_launch_returns_before_scoring_ends_and_collect_gives_the_result():
    go = threading.Event()
    seen = {}

    def reward_fn(data, return_dict=False):
        seen["waited"] = go.wait(timeout=60)  # released by the caller only after launch() returned
        seen["thread"] = threading.current_thread().name
        return {"reward_tensor": data.batch["responses"].float() * 2, "reward_extra_info": {}}

    scorer = AsyncRewardScorer(reward_fn)
    batch = DataProto.from_dict({"responses": torch.arange(6).view(3, 2)})
    pending = scorer.launch(batch)
    batch.batch["old_log_probs"] = torch.zeros(3, 2)  # a later stage adds keys meanwhile: the scorer's view is its own
    go.set()
    result = scorer.collect(pending)
    scorer.close()
    assert seen["waited"] is True and seen["thread"].startswith("hybridflow-reward")
    assert torch.equal(result["reward_tensor"], torch.arange(6).view(3, 2).float() * 2)


def test_errors_of_the_scorer_surface_in_the_trainer():
    def broken(data, return_dict=False):
        raise RuntimeError("scorer exploded")

    scorer = AsyncRewardScorer(broken)
    with pytest.raises(RuntimeError, match="scorer exploded"):
        scorer.collect(scorer.launch(DataProto.from_dict({"x": torch.zeros(1, 1)})))
    scorer.close()


@pytest.mark.parametrize("extra,message", [
    (["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"], "filter_groups"),
    (["reward_model.enable=true"], "reward-model worker group"),
    ([], "use_reward_loop=true .* already scores every trajectory"),
])
def test_refused_where_scores_are_needed_earlier(extra, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                     "reward_model.launch_reward_fn_async=true", *extra])
    load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
                 "reward_model.launch_reward_fn_async=true", "reward_model.use_reward_loop=false"])  # accepted
