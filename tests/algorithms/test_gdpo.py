"""GDPO's decoupled normalisation: each reward component normalised within its group apart, then weighted, summed
and whitened; through ``compute_advantage`` from the reward function's dict columns."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridflow.algorithms import compute_advantage, get_adv_estimator_fn
from hybridflow.algorithms.gdpo import GDPOError
from hybridflow.protocol import DataProto

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.float32)
UID = np.array(["a", "a", "a", "a"], dtype=object)
ACC = [1.0, 0.0, 1.0, 0.0]
FMT = [0.1, 0.1, 0.0, 0.1]


def algo(keys=("acc", "fmt"), weights=None, norm=True):
    return SimpleNamespace(gdpo_reward_keys=list(keys) if keys else None, gdpo_reward_weights=weights,
                           norm_adv_by_std_in_grpo=norm)


def columns(acc=ACC, fmt=FMT):
    return {"acc": np.array(acc, dtype=object), "fmt": np.array(fmt, dtype=object)}


def gdpo(non_tensor, config):
    adv, ret = get_adv_estimator_fn("gdpo")(torch.zeros_like(MASK), MASK, UID, config=config,
                                            non_tensor_batch=non_tensor)
    assert torch.equal(adv, ret)
    return adv


def expected(components, weights):
    """The definition written out: per-component (r - mean) / (std + 1e-6) in the group, weighted sum, token whiten."""
    total = torch.zeros(4)
    for w, r in zip(weights, components):
        r = torch.tensor(r)
        total += w * (r - r.mean()) / (r.std() + 1e-6)
    tokens = total.unsqueeze(-1).expand_as(MASK)[MASK.bool()]
    return (total.unsqueeze(-1) - tokens.mean()) / torch.sqrt(tokens.var() + 1e-8) * MASK


def test_gdpo_normalises_each_component_apart():
    adv = gdpo(columns(), algo())
    assert torch.allclose(adv, expected([ACC, FMT], [1.0, 1.0]), atol=1e-5)
    # the format bonus is 10x smaller than accuracy, yet counts as much: row 2 (correct, no format) ranks below
    # row 0 (correct and formatted) by a full component's worth, unlike with GRPO on the summed score
    assert adv[0, 0] > adv[2, 0] and (adv[0, 0] - adv[2, 0]) > 1.0


def test_gdpo_is_invariant_to_a_components_scale_and_honours_weights():
    base = gdpo(columns(), algo())
    scaled = gdpo(columns(fmt=[100 * x for x in FMT]), algo())
    assert torch.allclose(base, scaled, atol=1e-4)  # (up to the 1e-6 of the std)
    grpo = get_adv_estimator_fn("grpo")
    summed = lambda fmt: torch.tensor([a + f for a, f in zip(ACC, fmt)]).unsqueeze(-1) * torch.eye(4)[3].expand(4, 4)
    g1, _ = grpo(summed(FMT), torch.ones(4, 4), UID)
    g2, _ = grpo(summed([100 * x for x in FMT]), torch.ones(4, 4), UID)
    assert not torch.allclose(g1, g2, atol=1e-3)  # GRPO of the sum changes when one component is rescaled
    weighted = gdpo(columns(), algo(weights=[1.0, 0.25]))
    assert torch.allclose(weighted, expected([ACC, FMT], [1.0, 0.25]), atol=1e-5)


def test_gdpo_through_compute_advantage_reads_the_reward_columns():
    data = DataProto.from_dict(
        tensors={"token_level_rewards": torch.zeros(4, 4), "response_mask": MASK},
        non_tensors={"uid": UID, **columns()})
    cfg = SimpleNamespace(use_pf_ppo=False, **vars(algo()))
    out = compute_advantage(data, "gdpo", config=cfg)
    assert torch.allclose(out.batch["advantages"], expected([ACC, FMT], [1.0, 1.0]), atol=1e-5)


def test_gdpo_names_a_missing_component_and_a_weight_count_mismatch():
    with pytest.raises(GDPOError, match=r"gdpo_reward_keys names 'format_reward'.*did not return"):
        gdpo(columns(), algo(keys=("acc", "format_reward")))
    with pytest.raises(GDPOError, match=r"2 entries for 3"):
        gdpo({**columns(), "x": np.ones(4)}, algo(keys=("acc", "fmt", "x"), weights=[1.0, 2.0]))


def test_gdpo_without_keys_is_grpo_whitened():
    rewards = torch.zeros(4, 4)
    rewards[torch.arange(4), torch.tensor([2, 1, 3, 0])] = torch.tensor(ACC)
    adv, _ = get_adv_estimator_fn("gdpo")(rewards, MASK, UID, config=algo(keys=None))
    assert torch.allclose(adv, expected([ACC], [1.0]), atol=1e-5)
