"""ActorRolloutRefWorker on one rank (local backend semantics): micro-batching invariance, LoRA as
reference, rollout/actor log-prob agreement, KL/entropy terms."""

import pytest
import torch


def _worker(config_factory, model_dir, *overrides, eps_one=True, role="actor_rollout_ref"):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(model_dir, *overrides)
    if eps_one:  # Adam's first step becomes ~linear in the gradient, so equal grads <=> equal weights
        cfg.actor_rollout_ref.actor.optim.override_optimizer_config = {"eps": 1.0}
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role)
    worker.init_model()
    worker.test_config = cfg  # the full config, for generating through the rollout service
    return worker


def _vocab(worker):
    return worker.actor_engine.module.config.vocab_size


def test_fixed_and_dynamic_micro_batches_give_the_same_update(tiny_model_dir, config_factory, batches):
    results = []
    for overrides in (
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"],
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"],  # a shorter last micro-batch (verl 0.9 allows it)
        ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=14"],
    ):
        worker = _worker(config_factory, tiny_model_dir, *overrides)
        data = batches.make_update_batch(_vocab(worker), seed=3)
        metrics = batches.run_update(worker, data)
        results.append((metrics, worker.actor_engine.full_state_dict()))
    (m0, s0) = results[0]
    for m, s in results[1:]:
        assert m["actor/pg_loss"] == pytest.approx(m0["actor/pg_loss"], abs=1e-6)
        assert m["actor/grad_norm"] == pytest.approx(m0["actor/grad_norm"], rel=1e-5)
        for k in s0:
            assert torch.allclose(s[k], s0[k], atol=1e-7, rtol=1e-5), k


def test_lora_actor_with_adapter_disabled_reference(tiny_model_dir, config_factory, batches):
    from hybridflow.engine.model_loader import load_causal_lm

    worker = _worker(
        config_factory, tiny_model_dir, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.optim.lr=5e-2", eps_one=False,
    )
    assert worker.ref_engine is None  # the reference is the actor without adapters
    trainable = [n for n, p in worker.actor_engine.module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    base = load_causal_lm(tiny_model_dir).eval()
    data = batches.make_update_batch(_vocab(worker), seed=4)
    data.meta_info["temperature"] = 1.0
    mask = data.batch["response_mask"].bool()
    with torch.no_grad():
        expected = batches.padded_reference_log_probs(base, data)
    for _ in range(2):  # before and after training the adapters
        ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
        assert torch.allclose(ref[mask], expected[mask], atol=1e-5)
        batches.run_update(worker, data)
    actor_lp = worker.compute_log_prob(data).batch["old_log_probs"]
    assert (actor_lp[mask] - expected[mask]).abs().max() > 1e-3  # the adapters did learn something


def test_rollout_log_probs_match_recomputed_actor_log_probs(tiny_model_dir, config_factory, batches):
    worker = _worker(
        config_factory, tiny_model_dir, "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.temperature=0.8",
    )
    prompts = batches.prompts_of(batches.make_rollout_batch(_vocab(worker), batch_size=3, seed=5))
    out = batches.generate(worker, worker.test_config, prompts)
    assert len(out) == 3 * 2 and "rollout_log_probs" in out.batch
    out.meta_info["temperature"] = 0.8
    lp = worker.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    assert torch.allclose(lp.batch["old_log_probs"][mask], out.batch["rollout_log_probs"][mask], atol=1e-4)
    assert (lp.batch["entropys"][mask] > 0).all()
    from hybridflow.algorithms.rollout_correction import rollout_probs_diff

    diff = rollout_probs_diff(out.batch["rollout_log_probs"], lp.batch["old_log_probs"], mask)
    assert diff["training/rollout_probs_diff_mean"] < 1e-4


def test_kl_loss_and_entropy_bonus_are_applied_and_reported(tiny_model_dir, config_factory, batches):
    worker = _worker(
        config_factory, tiny_model_dir, "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.5", "actor_rollout_ref.actor.entropy_coeff=0.01",
    )
    data = batches.make_update_batch(_vocab(worker), seed=6)
    data = data.union(worker.compute_ref_log_prob(data))
    data = data.union(worker.compute_log_prob(data))
    metrics = worker.update_actor(data).meta_info["metrics"]
    # ref == actor before the first step, so the first mini-batch's KL is 0; the second sees a moved actor
    assert metrics["actor/kl_loss"][0] == pytest.approx(0.0, abs=1e-7)
    assert metrics["actor/kl_loss"][1] > 0
    assert all(e > 0 for e in metrics["actor/entropy"])
    assert metrics["actor/kl_coef"] == [0.5, 0.5]
    assert metrics["actor/lr"] == [1e-3]


def _mean_over_responses(worker, data, key):
    mask = data.batch["response_mask"].bool()
    return float(worker.compute_log_prob(data).batch[key][mask].mean())


@pytest.mark.parametrize("term", ["entropy_bonus", "kl_loss"])
def test_the_entropy_bonus_and_the_kl_loss_pull_the_policy_their_way(term, tiny_model_dir, config_factory, batches):
    """With zero advantages the policy gradient is zero and one term alone moves the actor: the entropy bonus
    (``- entropy_coeff x H``) raises the entropy, the KL loss (``+ kl_loss_coef x KL``) pulls the log-probs towards
    a reference that gives the sampled tokens more probability."""
    A = "actor_rollout_ref.actor"
    overrides = ([f"{A}.entropy_coeff=0.5"] if term == "entropy_bonus" else
                 [f"{A}.use_kl_loss=true", f"{A}.kl_loss_coef=1.0", f"{A}.entropy_coeff=0"])
    # Adam with eps 1: a small step along the gradient (a sign-like step of lr on every weight could overshoot
    # the near-uniform random model's entropy maximum)
    worker = _worker(config_factory, tiny_model_dir, *overrides, f"{A}.optim.lr=0.1")
    data = batches.make_update_batch(_vocab(worker), seed=7)
    data.batch["advantages"] = torch.zeros_like(data.batch["advantages"])
    key = "entropys" if term == "entropy_bonus" else "old_log_probs"
    before = _mean_over_responses(worker, data, key)
    if term == "kl_loss":
        data.batch["ref_log_prob"] = worker.compute_log_prob(data).batch["old_log_probs"] + 0.5
    batches.run_update(worker, data)
    after = _mean_over_responses(worker, data, key)
    assert after > before + 1e-5, (before, after)


def test_update_without_ref_log_prob_is_a_clear_error(tiny_model_dir, config_factory, batches):
    worker = _worker(config_factory, tiny_model_dir, "actor_rollout_ref.actor.use_kl_loss=true", role="actor")
    data = batches.make_update_batch(_vocab(worker), seed=7)
    data = data.union(worker.compute_log_prob(data))
    with pytest.raises(KeyError, match="ref_log_prob"):
        worker.update_actor(data)


def test_non_finite_updates_are_skipped_then_abort(tiny_model_dir, config_factory, batches):
    from hybridflow.workers.actor import NonFiniteGradientError

    worker = _worker(config_factory, tiny_model_dir, "actor_rollout_ref.actor.max_consecutive_skipped_steps=2")
    data = batches.make_update_batch(_vocab(worker), seed=13, rows=4)  # one mini-batch per update
    data.batch["advantages"][0, 0] = float("nan")
    before = {k: v.clone() for k, v in worker.actor_engine.module.state_dict().items()}
    metrics = batches.run_update(worker, data)
    assert metrics["actor/nonfinite_grad_skipped"] == [1.0]
    assert all(torch.equal(before[k], v) for k, v in worker.actor_engine.module.state_dict().items())
    with pytest.raises(NonFiniteGradientError, match="max_consecutive_skipped_steps"):
        batches.run_update(worker, data)


def test_colocated_worker_engine_choice(tiny_model_dir, config_factory):
    """The hybrid worker builds hf, vllm or sglang; without vLLM installed the error names the extra."""
    import importlib.util

    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(tiny_model_dir)
    cfg.actor_rollout_ref.rollout.name = "trtllm"
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout")
    with pytest.raises(ValueError, match="rollout.name='trtllm'"):
        worker.init_model()
    if importlib.util.find_spec("vllm") is None:
        cfg.actor_rollout_ref.rollout.name = "vllm"
        worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout")
        with pytest.raises(ImportError, match=r"hybridflow\[vllm\].*make venv-vllm"):
            worker.init_model()
    with pytest.raises(ValueError, match="role must be one of"):
        ActorRolloutRefWorker(cfg.actor_rollout_ref, "critic")


def test_split_placement_weight_sync_into_a_rollout_only_worker(tiny_model_dir, config_factory, batches):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    actor = _worker(config_factory, tiny_model_dir, role="actor", eps_one=False)
    rollout = _worker(config_factory, tiny_model_dir, role="rollout", eps_one=False)
    batches.run_update(actor, batches.make_update_batch(_vocab(actor), seed=14))
    seconds = rollout.update_rollout_weights(actor.get_actor_weights())
    assert seconds >= 0
    mine, theirs = actor.actor_engine.module.state_dict(), rollout.actor_engine.module.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not any(p.requires_grad for p in rollout.actor_engine.module.parameters())
    with pytest.raises(RuntimeError, match="already uses the actor's weights"):
        ActorRolloutRefWorker.update_rollout_weights(actor, {})


def test_sampling_stream_is_a_function_of_the_step(tiny_model_dir, config_factory, batches):
    """Resumed runs sample what the uninterrupted run sampled: generation reseeds from global_steps."""
    worker = _worker(config_factory, tiny_model_dir, role="actor_rollout")
    prompts = batches.prompts_of(batches.make_rollout_batch(_vocab(worker), batch_size=3, seed=15))
    outs = {}
    for step in (3, 4, 3):
        prompts.meta_info["global_steps"] = step
        outs.setdefault(step, []).append(batches.generate(worker, worker.test_config, prompts).batch["responses"])
    assert torch.equal(outs[3][0], outs[3][1])
    assert not torch.equal(outs[3][0], outs[4][0])


def _update_with_grad_snapshot(worker, data):
    """update_actor, keeping a copy of the gradients the optimiser step is about to apply."""
    engine, grads = worker.actor_engine, {}
    step = engine.optimizer_step

    def snapshot_then_step(*args, **kwargs):
        grads.update({n: p.grad.detach().clone() for n, p in engine.module.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    engine.optimizer_step = snapshot_then_step
    try:
        return worker.update_actor(data).meta_info["metrics"], grads
    finally:
        del engine.optimizer_step


def test_old_log_probs_from_the_update_pass_equal_the_explicit_forward(tiny_model_dir, config_factory, batches):
    """One on-policy optimiser step: pi_old = detached log-prob of the update's own pass (ratio 1) gives the
    loss, gradients and entropy metric of the separate old-log-prob forward (StepPlan.old_log_prob_in_update)."""
    from hybridflow.protocol import DataProto
    from hybridflow.algorithms.batch_ops import OLD_LOG_PROBS_FROM_UPDATE

    overrides = ["actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                 "actor_rollout_ref.actor.clip_ratio=0.1"]
    explicit_worker = _worker(config_factory, tiny_model_dir, *overrides)
    data = batches.make_update_batch(_vocab(explicit_worker), seed=11)
    assert len(data) == 8  # 4 prompts x rollout.n=2: one mini-batch
    explicit = DataProto.from_dict(dict(data.batch), dict(data.non_tensor_batch), dict(data.meta_info))
    old = explicit_worker.compute_log_prob(explicit)
    explicit.batch["old_log_probs"] = old.batch["old_log_probs"]
    m_explicit, g_explicit = _update_with_grad_snapshot(explicit_worker, explicit)

    skip_worker = _worker(config_factory, tiny_model_dir, *overrides)
    skipped = DataProto.from_dict(dict(data.batch), dict(data.non_tensor_batch), dict(data.meta_info))
    skipped.meta_info[OLD_LOG_PROBS_FROM_UPDATE] = True
    m_skip, g_skip = _update_with_grad_snapshot(skip_worker, skipped)

    assert m_skip["actor/pg_loss"] == pytest.approx(m_explicit["actor/pg_loss"], abs=1e-6)
    assert m_skip["actor/pg_clipfrac"] == m_explicit["actor/pg_clipfrac"] == [0.0]
    assert abs(m_skip["actor/ppo_kl"][0]) < 1e-7
    assert g_skip.keys() == g_explicit.keys() and g_skip
    for name, grad in g_explicit.items():
        assert torch.allclose(g_skip[name], grad, atol=1e-6), name
    # the entropy the skipped stage reported (token-mean over responses) now comes from the update pass
    mask = explicit.batch["response_mask"]
    expected_entropy = float((old.batch["entropys"] * mask).sum() / mask.sum())
    assert sum(m_skip["actor/entropy"]) == pytest.approx(expected_entropy, abs=1e-5)
    for k in explicit_worker.actor_engine.full_state_dict():
        assert torch.allclose(skip_worker.actor_engine.full_state_dict()[k],
                              explicit_worker.actor_engine.full_state_dict()[k], atol=1e-6), k


def test_old_log_probs_from_the_update_refuse_a_multi_step_update(tiny_model_dir, config_factory, batches):
    from hybridflow.algorithms.batch_ops import OLD_LOG_PROBS_FROM_UPDATE

    worker = _worker(config_factory, tiny_model_dir, "actor_rollout_ref.actor.ppo_mini_batch_size=2")
    data = batches.make_update_batch(_vocab(worker), seed=12)
    data.meta_info[OLD_LOG_PROBS_FROM_UPDATE] = True
    with pytest.raises(ValueError, match="ppo_mini_batch_size >= data.train_batch_size"):
        worker.update_actor(data)
