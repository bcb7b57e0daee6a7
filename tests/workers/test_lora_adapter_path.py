"""``actor_rollout_ref.model.lora_adapter_path``: training starts from a saved PEFT adapter (issue 15, item 1)."""

import pytest
import torch

A = "actor_rollout_ref"


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A rank-2 LoRA adapter with non-zero B (a fresh one is the identity), saved by peft."""
    from peft import LoraConfig, get_peft_model

    from hybridflow.engine.model_loader import load_causal_lm

    model = get_peft_model(load_causal_lm(tiny_model_dir),
                           LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    out = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(out)
    return str(out), model.eval()


def _worker(config_factory, model_dir, *overrides):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(model_dir, *overrides)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    return worker


def test_the_actor_starts_from_the_adapter(tiny_model_dir, adapter_dir, config_factory, batches):
    from hybridflow.engine.model_loader import load_causal_lm

    path, peft_model = adapter_dir
    worker = _worker(config_factory, tiny_model_dir, f"{A}.model.lora_adapter_path={path}")  # lora_rank stays 0
    module = worker.actor_engine.module
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert module.peft_config["default"].r == 2 and module.peft_config["default"].lora_alpha == 6
    data = batches.make_update_batch(module.config.vocab_size, seed=2)
    data.meta_info["temperature"] = 1.0
    mask = data.batch["response_mask"].bool()
    actor_lp = worker.compute_log_prob(data).batch["old_log_probs"]
    with torch.no_grad():
        expected = batches.padded_reference_log_probs(peft_model, data)
        base = batches.padded_reference_log_probs(load_causal_lm(tiny_model_dir).eval(), data)
    assert torch.allclose(actor_lp[mask], expected[mask], atol=1e-5)  # the saved adapter is in force
    assert (actor_lp[mask] - base[mask]).abs().max() > 1e-3  # ... and it is not the base model
    # the reference policy is the base model (adapter disabled), as in verl
    assert worker.ref_engine is None
    ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
    assert torch.allclose(ref[mask], base[mask], atol=1e-5)


def test_resume_restores_the_checkpoint_not_the_adapter(tiny_model_dir, adapter_dir, config_factory, batches,
                                                        tmp_path):
    """verl's order: the adapter initialises the actor, a checkpoint then restores the trained weights over it."""
    from hybridflow.trainer.run_checkpoint import lora_metadata

    path, _ = adapter_dir
    overrides = (f"{A}.model.lora_adapter_path={path}", f"{A}.actor.optim.lr=5e-2")
    first = _worker(config_factory, tiny_model_dir, *overrides)
    data = batches.make_update_batch(first.actor_engine.module.config.vocab_size, seed=3)
    batches.run_update(first, data)
    trained = first.actor_engine.full_state_dict()
    first.save_checkpoint(str(tmp_path / "actor"), global_step=1)

    resumed = _worker(config_factory, tiny_model_dir, *overrides)
    fresh = resumed.actor_engine.full_state_dict()
    assert any(not torch.equal(fresh[k], trained[k]) for k in trained)  # training moved the adapter
    resumed.load_checkpoint(str(tmp_path / "actor"))
    restored = resumed.actor_engine.full_state_dict()
    assert all(torch.equal(restored[k], trained[k]) for k in trained)
    # the checkpoint manifest records the adapter's own rank and alpha (merge folds with alpha / r)
    cfg = config_factory(tiny_model_dir, *overrides)
    assert lora_metadata(cfg.actor_rollout_ref.model) == {"lora": {"lora_rank": 2, "lora_alpha": 6.0}}


def test_a_folder_without_an_adapter_is_named(tiny_model_dir, config_factory, tmp_path):
    from hybridflow.engine.model_loader import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"lora_adapter_path=.*no adapter_config.json"):
        _worker(config_factory, tiny_model_dir, f"{A}.model.lora_adapter_path={tmp_path}")
