"""One update with each policy loss raises the log-prob of positive-advantage tokens and lowers it for negative ones.

The policy is a free table of logits, one independent categorical per (row, position), so a token's log-prob
moves only through its own loss term.  Each registered loss (and verl's bypass-mode loss, both loss types) takes
one SGD step from pi_old = pi_theta; rows 0-1 have advantage +1, rows 2-3 advantage -1.  A sign error, a dropped
advantage or a detached log-prob anywhere in a loss fails here.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import POLICY_LOSS_REGISTRY, get_policy_loss_fn, with_global_batch_info
from hybridflow.algorithms.bypass_loss import BypassSettings, compute_policy_loss_bypass_mode

B, R, V = 4, 5, 7
ADV = torch.tensor([1.0, 1.0, -1.0, -1.0]).unsqueeze(-1).expand(B, R).contiguous()
MASK = torch.ones(B, R)
MASK[1, 3:] = 0  # a shorter response: its padding must not move
TOKENS = torch.randint(0, V, (B, R), generator=torch.Generator().manual_seed(0))
# clip_cov / kl_cov pick a share of tokens to treat specially; these losses must still never push a token the
# wrong way (a picked token may stay put)
MAY_HOLD_TOKENS = {"clip_cov", "kl_cov"}


def _log_probs(theta: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(theta, -1).gather(-1, TOKENS.unsqueeze(-1)).squeeze(-1)


def _one_step(loss_fn) -> torch.Tensor:
    """Change of every token's log-prob after one SGD step on ``loss_fn(old, log_prob)``."""
    theta = torch.randn(B, R, V, generator=torch.Generator().manual_seed(1)).requires_grad_()
    before = _log_probs(theta)
    loss, _ = loss_fn(before.detach(), before)
    loss.backward()
    with torch.no_grad():
        theta -= 0.5 * theta.grad
        return _log_probs(theta) - before.detach()


def _config():
    from hybridflow.launch.config import load_config

    actor = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                         "critic.ppo_micro_batch_size_per_gpu=4"]).actor_rollout_ref.actor
    return with_global_batch_info(actor, global_token_num=int(MASK.sum()), global_batch_size=B)


def _check(delta: torch.Tensor, may_hold: bool) -> None:
    valid = MASK.bool()
    pos, neg = valid & (ADV > 0), valid & (ADV < 0)
    assert (delta[~valid] == 0).all()  # masked positions get no gradient at all
    if may_hold:
        assert (delta[pos] >= 0).all() and (delta[neg] <= 0).all()
        assert delta[pos].mean() > 1e-3 and delta[neg].mean() < -1e-3
    else:
        assert (delta[pos] > 1e-4).all(), delta[pos]
        assert (delta[neg] < -1e-4).all(), delta[neg]


@pytest.mark.parametrize("mode", POLICY_LOSS_REGISTRY.names())
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_registered_loss_moves_log_probs_with_the_advantage(mode, agg):
    fn, cfg = get_policy_loss_fn(mode), _config()
    delta = _one_step(lambda old, lp: fn(old, lp, ADV, MASK, agg, cfg, None))
    _check(delta, mode in MAY_HOLD_TOKENS)


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_loss_moves_log_probs_with_the_advantage(loss_type):
    settings = BypassSettings(loss_type=loss_type, rollout_is="token")
    delta = _one_step(lambda mu, lp: compute_policy_loss_bypass_mode(mu, lp, ADV, MASK, "token-mean", _config(),
                                                                     settings))
    _check(delta, may_hold=False)


def test_every_loss_of_the_registry_is_covered():
    names = set(POLICY_LOSS_REGISTRY.names())
    assert {"vanilla", "gspo", "gpg", "cispo", "sapo", "geo_mean", "clip_cov", "kl_cov"} <= names
