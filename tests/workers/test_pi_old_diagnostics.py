"""``actor/entropy`` and ``training/rollout_probs_diff_*`` when no separate pi_old pass runs (issue 15, item 5):
the update reports them from its first forward pass, and they equal what the skipped pass would have given."""

import pytest
import torch

from hybridflow.algorithms import agg_loss
from hybridflow.algorithms.batch_ops import PI_OLD_DIAGNOSTICS_IN_UPDATE
from hybridflow.algorithms.rollout_correction import rollout_probs_diff

A = "actor_rollout_ref"


def _worker(config_factory, model_dir, *overrides):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(model_dir, *overrides)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout")
    worker.init_model()
    return worker


@pytest.mark.parametrize("micro", [1, 4])
def test_reused_rollout_log_probs_get_entropy_and_probs_diff_from_the_update(tiny_model_dir, config_factory, batches,
                                                                             micro):
    # one optimiser step on the batch (quickstart's path): 4 rows x n=2 = 8 trajectories in one mini-batch
    worker = _worker(config_factory, tiny_model_dir, f"{A}.actor.ppo_mini_batch_size=4",
                     f"{A}.actor.ppo_micro_batch_size_per_gpu={micro}", f"{A}.rollout.calculate_log_probs=true")
    data = batches.make_update_batch(worker.actor_engine.module.config.vocab_size, seed=7)
    reference = worker.compute_log_prob(data)  # what the skipped old_log_prob stage would have computed
    mask = data.batch["response_mask"]
    g = torch.Generator().manual_seed(0)
    # a rollout engine whose numbers differ from the actor's by kernel noise
    rollout_lp = (reference.batch["old_log_probs"] + 0.05 * torch.randn(mask.shape, generator=g)).clamp(max=0.0)
    data.batch["rollout_log_probs"] = rollout_lp * mask
    data.batch["old_log_probs"] = data.batch["rollout_log_probs"]
    data.meta_info[PI_OLD_DIAGNOSTICS_IN_UPDATE] = True
    metrics = worker.update_actor(data).meta_info["metrics"]

    expected_entropy = agg_loss(reference.batch["entropys"], mask, "token-mean").item()
    assert metrics["actor/entropy"] == [pytest.approx(expected_entropy, rel=1e-5)]
    expected = rollout_probs_diff(data.batch["rollout_log_probs"], reference.batch["old_log_probs"], mask)
    for key, value in expected.items():
        assert metrics[key] == [pytest.approx(value, rel=1e-5, abs=1e-9)], key
    assert expected["training/rollout_probs_diff_mean"] > 1e-4  # the noise is seen


def test_only_the_first_mini_batch_reports_them(tiny_model_dir, config_factory, batches):
    """With several optimiser steps (bypass mode) only the first forward pass is at pi_old."""
    worker = _worker(config_factory, tiny_model_dir, f"{A}.actor.ppo_mini_batch_size=2",
                     f"{A}.actor.ppo_micro_batch_size_per_gpu=2")
    data = batches.make_update_batch(worker.actor_engine.module.config.vocab_size, seed=8)
    data = data.union(worker.compute_log_prob(data))
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"].clone()
    data.meta_info[PI_OLD_DIAGNOSTICS_IN_UPDATE] = True
    metrics = worker.update_actor(data).meta_info["metrics"]
    assert len(metrics["actor/pg_loss"]) == 2 and len(metrics["actor/entropy"]) == 1
    assert metrics["training/rollout_probs_diff_max"] == [pytest.approx(0.0, abs=1e-6)]
    # without the flag the update reports neither (a pi_old pass ran before it)
    data.meta_info.pop(PI_OLD_DIAGNOSTICS_IN_UPDATE)
    metrics = worker.update_actor(data).meta_info["metrics"]
    assert "actor/entropy" not in metrics and "training/rollout_probs_diff_mean" not in metrics


def test_probs_diff_sums_combine_like_the_whole_batch():
    from hybridflow.algorithms.rollout_correction import rollout_probs_diff_from_sums, rollout_probs_diff_sums

    g = torch.Generator().manual_seed(1)
    a = -torch.rand(6, 5, generator=g)
    r = -torch.rand(6, 5, generator=g)
    m = (torch.rand(6, 5, generator=g) > 0.3).float()
    parts = [rollout_probs_diff_sums(r[i:i + 2], a[i:i + 2], m[i:i + 2]) for i in range(0, 6, 2)]
    merged = {k: sum(p[k] for p in parts) for k in parts[0] if k != "max_d"}
    merged["max_d"] = max(p["max_d"] for p in parts)
    whole = rollout_probs_diff(r, a, m)
    got = rollout_probs_diff_from_sums(merged)
    assert got.keys() == whole.keys()
    for key in whole:
        assert got[key] == pytest.approx(whole[key], rel=1e-9)
    # cross-check against a direct computation
    d = (r.exp() - a.exp()).abs()[m.bool()]
    assert whole["training/rollout_probs_diff_std"] == pytest.approx(d.std().item(), rel=1e-5)
