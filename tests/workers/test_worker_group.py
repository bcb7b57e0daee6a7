"""The role workers behind the controller's local worker group: @register plumbing end to end."""

import torch


def test_actor_rollout_ref_through_a_local_worker_group(tiny_model_dir, config_factory, batches):
    from hybridflow.controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(tiny_model_dir, "actor_rollout_ref.actor.use_kl_loss=true")
    group = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(ActorRolloutRefWorker, cfg.actor_rollout_ref,
                                                                    "actor_rollout_ref"))
    group.init_model()
    vocab = group.worker.actor_engine.module.config.vocab_size
    prompts = batches.prompts_of(batches.make_rollout_batch(vocab, batch_size=2, seed=12))
    prompts.meta_info["temperature"] = 1.0
    batch = batches.generate(group, cfg, prompts)
    assert batch.batch["responses"].shape[0] == 4  # rollout.n = 2, interleaved
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape)
    batch.meta_info["temperature"] = 1.0
    batch = batch.union(group.compute_log_prob(batch))
    batch = batch.union(group.compute_ref_log_prob(batch))
    metrics = group.update_actor(batch).meta_info["metrics"]
    assert {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_loss", "actor/grad_norm", "actor/lr"} <= set(metrics)
