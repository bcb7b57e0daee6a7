"""RolloutHost's bucketed sync (the rollout next to a split actor) in one process: the engine's own copy ends
equal to the actor, a bucket the engine already holds is not loaded again (delta, per bucket), and a bucket the
engine refused once (checksum mismatch) is loaded again from memory."""

from __future__ import annotations

import warnings

import torch

from hybridflow.rollout.weights.delta import ChecksumMismatch


def _host(model_dir, engine_model, bucket_bytes=20_000):
    from hybridflow.launch.config import load_config
    from hybridflow.engine.model_loader import load_causal_lm, load_tokenizer
    from hybridflow.engine.train_engine import TrainEngine
    from hybridflow.rollout.base import create_rollout_engine
    from hybridflow.workers.rollout_host import RolloutHost

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu",
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                           "critic.ppo_micro_batch_size_per_gpu=1"])
    actor = TrainEngine(load_causal_lm(model_dir), cfg.actor_rollout_ref.actor.fsdp_config, None, role="actor")
    engine = create_rollout_engine("hf", model=engine_model, tokenizer=load_tokenizer(model_dir))
    return actor, engine, RolloutHost(engine, actor, name="t", shares_weights=False, bucket_bytes=bucket_bytes)


def _equal(actor, engine) -> bool:
    own = engine.model.state_dict()
    return all(torch.equal(own[k], v) for k, v in actor.module.state_dict().items())


def test_buckets_already_held_are_not_loaded_again(nano_model_dir):
    from hybridflow.engine.model_loader import load_causal_lm

    stale = load_causal_lm(nano_model_dir)
    with torch.no_grad():
        for p in stale.parameters():
            p.zero_()
    actor, engine, host = _host(nano_model_dir, stale)
    try:
        host.sync_weights()
        first = host.last_sync
        assert _equal(actor, engine) and first["update_weights/buckets"] > 2
        assert first["weight_sync/bytes_sent"] == first["weight_sync/bytes_total"] > 0
        host.sync_weights()  # nothing changed: every bucket gathered, none loaded
        assert host.last_sync["weight_sync/bytes_sent"] == 0
        with torch.no_grad():
            actor.module.model.layers[1].mlp.down_proj.weight.add_(0.5)
        host.sync_weights()
        third = host.last_sync
        assert 0 < third["weight_sync/bytes_sent"] < third["weight_sync/bytes_total"]
        assert _equal(actor, engine)
    finally:
        host.close()


def test_a_refused_bucket_is_loaded_again(nano_model_dir, monkeypatch):
    from hybridflow.engine.model_loader import load_causal_lm

    actor, engine, host = _host(nano_model_dir, load_causal_lm(nano_model_dir))
    real, refused = engine.update_weights, []

    def flaky(tensors):
        if not refused:
            refused.append(True)
            raise ChecksumMismatch("a flipped byte")
        return real(tensors)

    monkeypatch.setattr(engine, "update_weights", flaky)
    with torch.no_grad():
        actor.module.model.layers[0].self_attn.q_proj.weight.add_(0.5)
    try:
        host.sync_weights()
        assert refused and _equal(actor, engine)
        assert host.last_sync["weight_sync/checksum_mismatch"] == 1.0
    finally:
        host.close()
