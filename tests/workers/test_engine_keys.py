"""Keys of the model / engine that used to be accepted and ignored, now acting (issue 15, item 1):
``model.hf_config_path``, ``actor.use_remove_padding``, ``fsdp_config.full_determinism``,
``fsdp_config.wrap_policy.transformer_layer_cls_to_wrap`` / ``forward_prefetch``, ``entropy_checkpointing``,
``trainer.ray_wait_register_center_timeout``."""

import json
import os

import pytest
import torch

A = "actor_rollout_ref"


def _worker(config_factory, model_dir, *overrides, role="actor_rollout"):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(model_dir, *overrides)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, role)
    worker.init_model()
    return worker


def test_hf_config_path_supplies_the_model_config(tiny_model_dir, config_factory, tmp_path):
    alt = tmp_path / "alt_config"
    alt.mkdir()
    cfg = json.loads(open(os.path.join(tiny_model_dir, "config.json")).read())
    cfg["rms_norm_eps"] = 0.125  # a harmless, visible change
    (alt / "config.json").write_text(json.dumps(cfg))
    worker = _worker(config_factory, tiny_model_dir, f"{A}.model.hf_config_path={alt}")
    assert worker.actor_engine.module.config.rms_norm_eps == 0.125
    plain = _worker(config_factory, tiny_model_dir)
    assert plain.actor_engine.module.config.rms_norm_eps != 0.125


def test_actor_use_remove_padding_overrides_the_model_key(tiny_model_dir, config_factory):
    worker = _worker(config_factory, tiny_model_dir, f"{A}.model.use_remove_padding=true",
                     f"{A}.actor.use_remove_padding=false")
    assert worker.actor.use_remove_padding is False


def test_full_determinism_turns_on_deterministic_kernels(tiny_model_dir, config_factory, batches):
    before = torch.are_deterministic_algorithms_enabled()
    try:
        worker = _worker(config_factory, tiny_model_dir, f"{A}.actor.fsdp_config.full_determinism=true")
        assert torch.are_deterministic_algorithms_enabled()
        data = batches.make_update_batch(worker.actor_engine.module.config.vocab_size, seed=0)
        assert batches.run_update(worker, data)["actor/grad_norm"][0] > 0  # every op of an update has such a kernel
    finally:
        torch.use_deterministic_algorithms(before)


def test_entropy_checkpointing_gives_the_same_values_and_gradients(tiny_causal_lm_factory, batches):
    from hybridflow.engine.forward import response_log_probs

    results = []
    for flag in (False, True):
        model = tiny_causal_lm_factory()
        data = batches.make_rollout_batch(model.config.vocab_size, batch_size=3, seed=2).batch
        lp, ent = response_log_probs(model, data, 0.9, calculate_entropy=True, entropy_checkpointing=flag)
        (lp.sum() - 0.3 * ent.sum()).backward()
        results.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert torch.allclose(lp0, lp1) and torch.allclose(ent0, ent1)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(g0, g1))


def test_entropy_checkpointing_spellings(config_factory, tiny_model_dir):
    cfg = config_factory(tiny_model_dir, f"{A}.actor.fsdp_config.entropy_checkpointing=true")
    assert cfg.actor_rollout_ref.actor.entropy_checkpointing is True


def test_wrap_policy_names_the_units_and_unknown_names_are_errors(tiny_model_dir):
    from hybridflow.engine.fsdp import decoder_layer_classes
    from hybridflow.engine.model_loader import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    assert {c.__name__ for c in decoder_layer_classes(model, ["Qwen2MLP"])} == {"Qwen2MLP"}
    assert {c.__name__ for c in decoder_layer_classes(model)} == {"Qwen2DecoderLayer"}
    with pytest.raises(ValueError, match=r"transformer_layer_cls_to_wrap names \['LlamaDecoderLayer'\].*Qwen2DecoderLayer"):
        decoder_layer_classes(model, ["LlamaDecoderLayer"])


def test_fsdp2_units_and_forward_prefetch_on_a_one_rank_mesh(tiny_model_dir, tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.engine.fsdp import apply_fsdp2, fsdp_modules
    from hybridflow.engine.model_loader import load_causal_lm

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = load_causal_lm(tiny_model_dir)
        apply_fsdp2(model, init_device_mesh("cpu", (1,)), layer_cls_names=["Qwen2MLP"], forward_prefetch=True)
        units = [m for m in fsdp_modules(model) if m is not model]
        assert len(units) == 2 and all(type(m).__name__ == "FSDPQwen2MLP" for m in units)
        prefetched = units[0]._get_fsdp_state()._states_to_forward_prefetch
        assert len(prefetched) == 1 and prefetched[0] is units[1]._get_fsdp_state()
        ids = torch.randint(5, 20, (2, 6))
        assert model(input_ids=ids).logits.shape[:2] == (2, 6)  # and the model still runs
    finally:
        dist.destroy_process_group()


def test_register_center_timeout_sizes_the_ray_pool_wait(config_factory, tiny_model_dir, monkeypatch):
    from hybridflow.launch.processes import pool_options

    cfg = config_factory(tiny_model_dir, "trainer.ray_wait_register_center_timeout=17", "trainer.device=cpu")
    cfg.trainer.backend = "ray"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # fixes the CPU workers' threads (else: the cores divided)
    assert pool_options(cfg) == {"ready_timeout_s": 17.0, "threads_per_worker": 1}
    cfg.trainer.backend = "local"
    assert pool_options(cfg) == {}


def test_use_fused_kernels_fuses_the_head_and_trains_the_same(tiny_model_dir, config_factory, batches):
    """``model.use_fused_kernels=true`` (+ ``fused_kernel_options.chunk_size``) runs the actor's and the reference's
    LM head fused (engine/fused_head.py): the same log-probs and the same update as the materialised head."""
    from hybridflow.engine.fused_head import fused_head_settings

    results = []
    for flag in ("false", "true"):
        worker = _worker(config_factory, tiny_model_dir, f"{A}.model.use_fused_kernels={flag}",
                         f"{A}.model.fused_kernel_options.chunk_size=3", role="actor_rollout_ref")
        settings = fused_head_settings(worker.actor_engine.module)
        assert settings.enabled is (flag == "true") and settings.chunk_rows == 3
        assert fused_head_settings(worker.ref_engine.module).enabled is (flag == "true")
        data = batches.make_update_batch(worker.actor_engine.module.config.vocab_size, seed=5)
        logp = worker.compute_log_prob(data).batch["old_log_probs"]
        metrics = batches.run_update(worker, data)
        results.append((logp, metrics["actor/pg_loss"][0], metrics["actor/grad_norm"][0]))
    (lp0, loss0, norm0), (lp1, loss1, norm1) = results
    assert torch.allclose(lp0, lp1, atol=1e-5)
    assert loss0 == pytest.approx(loss1, abs=1e-5) and norm0 == pytest.approx(norm1, rel=1e-4)


def test_fused_kernel_options_outside_what_acts_are_refused(tiny_model_dir, config_factory):
    from hybridflow.config.errors import ConfigError

    with pytest.raises((ConfigError, ValueError), match="fused_kernel_options.chunk_size"):
        config_factory(tiny_model_dir, f"{A}.model.fused_kernel_options.chunk_size=-2")


def test_a_triton_backend_loads_with_a_note_that_the_torch_head_runs(tiny_model_dir):
    """verl's command lines name impl_backend=triton (a kernel choice): accepted, said to have no effect."""
    import warnings

    from hybridflow.config.checks import ConfigWarning
    from hybridflow.launch.config import load_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        cfg = load_config([f"{A}.model.path={tiny_model_dir}", "critic.ppo_micro_batch_size_per_gpu=4",
                           f"{A}.actor.ppo_micro_batch_size_per_gpu=4", f"{A}.model.use_fused_kernels=true",
                           f"{A}.model.fused_kernel_options.impl_backend=triton"])
    assert cfg.actor_rollout_ref.model.use_fused_kernels
    notes = [str(w.message) for w in caught if "have no effect" in str(w.message)]
    assert len(notes) == 1 and "fused_kernel_options.impl_backend='triton'" in notes[0]
