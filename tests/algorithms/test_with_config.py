"""The algorithms read hybridflow's typed config (verl key names) by attribute, unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hybridflow.algorithms import (
    POLICY_LOSS_REGISTRY,
    compute_advantage,
    count_loss_normalizers,
    get_kl_controller,
    get_policy_loss_fn,
    with_global_batch_info,
)
from hybridflow.launch.config import load_config
from hybridflow.protocol import DataProto

OVERRIDES = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
]


@pytest.fixture(scope="module")
def cfg():
    return load_config(OVERRIDES)


@pytest.mark.parametrize("name", sorted(POLICY_LOSS_REGISTRY.names()))
def test_policy_losses_accept_the_actor_config(cfg, name):
    actor = cfg.actor_rollout_ref.actor
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    view = with_global_batch_info(actor, **count_loss_normalizers(mask))
    loss, metrics = get_policy_loss_fn(name)(torch.full((2, 3), -1.1), logp, torch.ones(2, 3), mask, actor.loss_agg_mode, view)
    loss.backward()
    assert torch.isfinite(loss) and torch.all(logp.grad[mask == 0] == 0)
    assert "actor/ppo_kl" in metrics


@pytest.mark.parametrize("estimator", ["gae", "grpo", "rloo", "reinforce_plus_plus"])
def test_compute_advantage_with_the_algorithm_config(cfg, estimator):
    algo = cfg.algorithm
    data = DataProto.from_dict(
        {
            "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 2.0]]),
            "response_mask": torch.ones(4, 2),
            "values": torch.zeros(4, 2),
        },
        {"uid": np.array(["a", "a", "b", "b"], dtype=object)},
    )
    out = compute_advantage(data, estimator, algo.gamma, algo.lam, 2, algo.norm_adv_by_std_in_grpo, algo)
    assert out.batch["advantages"].shape == (4, 2)
    assert get_kl_controller(algo.kl_ctrl).value == algo.kl_ctrl.kl_coef
