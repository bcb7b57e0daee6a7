"""verl's ``loss_agg_mode=token-sum``: the same contracts verl's CPU tests check
(tests/trainer/ppo/test_loss_aggregation_on_cpu.py), re-stated here, plus the config accepting it."""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import agg_loss


def test_masked_sum_times_dp_size():
    loss = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert agg_loss(loss, mask, "token-sum", dp_size=4).item() == pytest.approx(13.0 * 4)
    assert agg_loss(loss, mask, "token-sum").item() == pytest.approx(13.0)


@pytest.mark.parametrize("pieces", [1, 2, 4])
def test_micro_batches_add_up_to_the_whole(pieces):
    loss = torch.arange(1, 25, dtype=torch.float32).reshape(8, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 8)
    rows = 8 // pieces
    parts = sum(agg_loss(loss[i:i + rows], mask[i:i + rows], "token-sum") for i in range(0, 8, rows))
    torch.testing.assert_close(parts, agg_loss(loss, mask, "token-sum"))


@pytest.mark.parametrize("dp", [2, 4])
def test_rank_average_equals_the_global_sum(dp):
    """FSDP/DDP average the ranks' gradients; each rank's sum x dp then averages to the global sum."""
    loss = torch.arange(1, 25, dtype=torch.float32).reshape(8, 3).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 0.0]] * 8)
    rows = 8 // dp
    ranks = [agg_loss(loss[i:i + rows], mask[i:i + rows], "token-sum", dp_size=dp) for i in range(0, 8, rows)]
    averaged = torch.stack(ranks).mean()
    torch.testing.assert_close(averaged, agg_loss(loss, mask, "token-sum"))
    averaged.backward()
    torch.testing.assert_close(loss.grad, mask)  # d(sum)/dL = mask: no hidden normaliser


def test_policy_loss_and_config_accept_token_sum():
    from hybridflow.algorithms import get_policy_loss_fn, with_global_batch_info
    from hybridflow.launch.config import load_config

    cfg = load_config(["actor_rollout_ref.actor.loss_agg_mode=token-sum",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4"])
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-sum" == cfg.critic.loss_agg_mode
    adv = torch.tensor([[1.0, 1.0, 1.0]])
    lp = torch.zeros(1, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    view = with_global_batch_info(cfg.actor_rollout_ref.actor, global_token_num=2, global_batch_size=1)
    loss, _ = get_policy_loss_fn("vanilla")(lp.detach(), lp, adv, mask, "token-sum", view)
    assert loss.item() == pytest.approx(-2.0)  # -A*r summed over the two valid tokens
