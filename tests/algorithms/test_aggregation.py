"""agg_loss modes (hand-computed) and the split invariance of losses with global normalisers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybridflow.algorithms import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_value_loss,
    count_loss_normalizers,
    get_policy_loss_fn,
    masked_mean,
    masked_var,
    masked_whiten,
    with_global_batch_info,
)

T = torch.tensor

LOSS = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # row 2 is an empty (padding) row


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 18 / 5),  # (1+2+4+5+6) / 5 tokens
        ("seq-mean-token-sum", 9.0),  # (3 + 15) / 2 non-empty sequences
        ("seq-mean-token-mean", 3.25),  # (3/2 + 15/3) / 2
        ("seq-mean-token-sum-norm", 3.0),  # (3 + 15) / (2 sequences · 3 padded length)
    ],
)
def test_agg_modes_hand_computed(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_global_normalisers_and_scale_factor():
    assert agg_loss(LOSS, MASK, "token-mean", global_token_num=9).item() == pytest.approx(18 / 9)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", global_batch_size=6).item() == pytest.approx(18 / 6)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=6).item() == pytest.approx(18 / 12)
    # dp_size multiplies (compensates the gradient average over ranks)
    assert agg_loss(LOSS, MASK, "token-mean", global_token_num=9, dp_size=2).item() == pytest.approx(4.0)


def test_agg_errors_name_the_fix():
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(LOSS, MASK, "sum-of-tokens")
    with pytest.raises(ValueError, match="global_token_num"):
        agg_loss(LOSS, MASK, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2)


def test_agg_empty_mask_gives_zero_with_graph():
    x = torch.ones(2, 2, requires_grad=True)
    loss = agg_loss(x, torch.zeros(2, 2), "token-mean")
    loss.backward()
    assert loss.item() == 0.0 and torch.all(x.grad == 0)


def test_agg_ignores_garbage_under_mask():
    noisy = torch.where(MASK.bool(), LOSS, torch.full_like(LOSS, float("inf")))
    for mode in LOSS_AGG_MODES:
        assert agg_loss(noisy, MASK, mode).item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())


def test_count_loss_normalizers():
    assert count_loss_normalizers(MASK) == {"global_token_num": 5, "global_batch_size": 2}


def test_masked_statistics_hand_computed():
    values = T([1.0, 2.0, 3.0, 100.0])
    mask = T([1.0, 1.0, 1.0, 0.0])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_var(values, mask).item() == pytest.approx(1.0)  # (1 + 0 + 1) / (3 − 1)
    assert torch.allclose(masked_whiten(values, mask)[:3], T([-1.0, 0.0, 1.0]), atol=1e-6)
    with pytest.raises(ValueError, match="single element"):
        masked_var(values, T([1.0, 0.0, 0.0, 0.0]))


# ------------------------------------------------------------------------------------------ split invariance
LENGTHS = [5, 3, 0, 1, 4, 2, 5]
SPLITS = [[7], [3, 4], [1, 4, 2]]


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    b, r = len(LENGTHS), 5
    mask = (torch.arange(r)[None, :] < T(LENGTHS)[:, None]).float()
    old = torch.randn(b, r, generator=g) * 0.2 - 1.0
    logp = old + torch.randn(b, r, generator=g) * 0.2
    adv = torch.randn(b, 1, generator=g).expand(b, r).contiguous()  # sequence-level advantages (GMPO needs them)
    return old, logp, adv, mask


def actor_cfg():
    return SimpleNamespace(
        clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28, clip_ratio_c=3.0, tau_pos=1.0, tau_neg=1.05,
        loss_scale_factor=None,
    )


def pieces(split):
    start = 0
    for size in split:
        yield slice(start, start + size)
        start += size


def split_loss_and_grad(name, mode, split, dp_size=1, loss_scale_factor=None):
    """Σ over micro-batches of the per-micro-batch loss computed with the global counts."""
    old, logp, adv, mask = make_batch()
    leaf = logp.clone().requires_grad_(True)
    counts = {"global_token_num": 0, "global_batch_size": 0}
    for sl in pieces(split):
        for key, value in count_loss_normalizers(mask[sl]).items():
            counts[key] += value
    cfg = with_global_batch_info(actor_cfg(), dp_size=dp_size, loss_scale_factor=loss_scale_factor, **counts)
    total = 0.0
    for sl in pieces(split):
        loss, _ = get_policy_loss_fn(name)(old[sl], leaf[sl], adv[sl], mask[sl], mode, cfg)
        loss.backward()
        total += loss.item()
    return total, leaf.grad


@pytest.mark.parametrize("name", ["vanilla", "gspo", "gpg", "cispo", "sapo", "geo_mean"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_loss_is_split_invariant(name, mode):
    old, logp, adv, mask = make_batch()
    leaf = logp.clone().requires_grad_(True)
    full, _ = get_policy_loss_fn(name)(old, leaf, adv, mask, mode, actor_cfg())
    full.backward()
    for split in SPLITS:
        total, grad = split_loss_and_grad(name, mode, split, loss_scale_factor=5)
        assert total == pytest.approx(full.item(), abs=1e-6), split
        assert torch.allclose(grad, leaf.grad, atol=1e-7), split


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_dp_ranks_average_to_the_full_batch_gradient(mode):
    # two ranks hold rows [0:3] and [3:7]; each splits its rows into micro-batches, scales by dp_size = 2,
    # and the (FSDP-style) gradient average over ranks must equal the full-batch gradient
    old, logp, adv, mask = make_batch()
    leaf = logp.clone().requires_grad_(True)
    get_policy_loss_fn("vanilla")(old, leaf, adv, mask, mode, actor_cfg())[0].backward()
    counts = count_loss_normalizers(mask)  # = the all-reduced sum of the two ranks' counts
    cfg = with_global_batch_info(actor_cfg(), dp_size=2, **counts)
    rank_grads = []
    for rows, micro in ((slice(0, 3), [1, 2]), (slice(3, 7), [3, 1])):
        rank_leaf = logp[rows].clone().requires_grad_(True)
        for sl in pieces(micro):
            o, a, m = old[rows][sl], adv[rows][sl], mask[rows][sl]
            get_policy_loss_fn("vanilla")(o, rank_leaf[sl], a, m, mode, cfg)[0].backward()
        rank_grads.append(rank_leaf.grad)
    # rank r's gradient lives on its own rows; the all-reduce mean over 2 ranks halves each
    averaged = torch.cat(rank_grads) / 2
    assert torch.allclose(averaged, leaf.grad, atol=1e-7)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_is_split_invariant(mode):
    old, logp, adv, mask = make_batch(seed=3)
    values, returns = old, adv
    vpreds = logp.clone().requires_grad_(True)
    full, _ = compute_value_loss(vpreds, returns, values, mask, 0.1, mode)
    full.backward()
    counts = count_loss_normalizers(mask)
    total = 0.0
    leaf = logp.clone().requires_grad_(True)
    for sl in pieces([2, 5]):
        loss, _ = compute_value_loss(leaf[sl], returns[sl], values[sl], mask[sl], 0.1, mode, **counts)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert torch.allclose(leaf.grad, vpreds.grad, atol=1e-7)
