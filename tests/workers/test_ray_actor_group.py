"""ActorRolloutRefWorker as a 2-process Ray worker group (the deployment path): rendezvous in
init_model, generation through both ranks' rollout servers, DP dispatch of log-prob / update, metrics
collected from both ranks."""

import pytest
import torch

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_group(tiny_model_dir, config_factory):
    import ray

    from hybridflow.controller import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, init_ray
    from hybridflow.rollout.service.replica import RAY_ROLLOUT_CONCURRENCY_GROUP
    from hybridflow.workers import ActorRolloutRefWorker

    cfg = config_factory(tiny_model_dir)
    init_ray({"num_cpus": 2})
    cls = RayClassWithInitArgs(ActorRolloutRefWorker, cfg.actor_rollout_ref, "actor_rollout_ref")
    cls.concurrency_groups = {RAY_ROLLOUT_CONCURRENCY_GROUP: 16}  # the rollout requests' thread pool
    group = RayWorkerGroup(RayResourcePool([2]), cls, role="actor_rollout_ref")
    group.init_model()
    group.test_config = cfg
    yield group
    group.shutdown()
    ray.shutdown()


def test_generate_log_prob_and_update_over_two_ray_ranks(ray_group, batches):
    prompts = batches.prompts_of(batches.make_rollout_batch(40, batch_size=4, seed=0))
    batch = batches.generate(ray_group, ray_group.test_config, prompts)
    assert batch.batch["responses"].shape[0] == 8  # 4 prompts x rollout.n=2, served by both ranks' engines
    batch.batch["advantages"] = torch.randn(batch.batch["responses"].shape)
    batch.meta_info["temperature"] = 1.0
    batch = batch.union(ray_group.compute_log_prob(batch))
    batch = batch.union(ray_group.compute_ref_log_prob(batch))
    m = batch.batch["response_mask"].bool()
    assert torch.allclose(batch.batch["ref_log_prob"][m], batch.batch["old_log_probs"][m], atol=1e-6)
    metrics = ray_group.update_actor(batch).meta_info["metrics"]
    # one entry per rank and mini-batch; the gradient norm is global, so ranks agree on it
    assert len(metrics["actor/grad_norm"]) == 4
    norms = metrics["actor/grad_norm"]
    assert norms[0] == pytest.approx(norms[2]) and norms[1] == pytest.approx(norms[3])
