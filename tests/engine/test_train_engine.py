"""TrainEngine on one process (no torch.distributed): clipping, non-finite skip, offload round-trip,
checkpoint round-trip with LR schedule + RNG, HF export (LoRA merged)."""

import os
from types import SimpleNamespace

import pytest
import torch

from hybridflow.engine.engine_checkpoint import (
    CheckpointMismatchError,
    load_engine_checkpoint,
    save_engine_checkpoint,
)
from hybridflow.engine.model_loader import apply_lora, load_causal_lm, load_tokenizer
from hybridflow.engine.train_engine import TrainEngine


def fsdp_cfg(**kw):
    from hybridflow.config.schema import MixedPrecisionConfig

    from hybridflow.config.schema import WrapPolicy

    base = dict(fsdp_size=-1, dtype="bfloat16", reshard_after_forward=True, offload_policy=False,
                param_offload=False, optimizer_offload=False, mixed_precision=MixedPrecisionConfig(),
                wrap_policy=WrapPolicy(min_num_params=0), forward_prefetch=False, full_determinism=False, seed=0)
    base.update(kw)
    return SimpleNamespace(**base)


def optim_cfg(**kw):
    base = dict(optimizer="AdamW", optimizer_impl="torch.optim", lr=1e-2, betas=[0.9, 0.999], weight_decay=0.01, override_optimizer_config=None,
                lr_warmup_steps=2, lr_warmup_steps_ratio=0.0, total_training_steps=10, min_lr_ratio=0.1,
                num_cycles=0.5, lr_scheduler_type="cosine", warmup_style=None)
    base.update(kw)
    return SimpleNamespace(**base)


def _loss(engine, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, engine.module.config.vocab_size, (2, 8), generator=g)
    return engine.module(input_ids=ids, labels=ids).loss


def _train_step(engine, seed, grad_clip=1.0):
    engine.zero_grad()
    _loss(engine, seed).backward()
    result = engine.optimizer_step(grad_clip)
    engine.lr_scheduler_step()
    return result


def test_grad_norm_is_reported_and_clipped(tiny_model_dir):
    engine = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    assert not engine.is_sharded and engine.dp_size == 1
    _loss(engine, 0).backward()
    params = [p for p in engine.module.parameters() if p.grad is not None]
    manual = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item()
    result = engine.optimizer_step(grad_clip=1e-3)
    assert result.stepped and result.grad_norm == pytest.approx(manual, rel=1e-5)
    assert result.lr == 0.1 * 1e-2  # cosine warm-up starts at min_lr_ratio


def test_non_finite_gradient_skips_the_step(tiny_model_dir):
    engine = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    _loss(engine, 0).backward()
    next(engine.module.parameters()).grad[0, 0] = float("nan")
    result = engine.optimizer_step(grad_clip=1.0)
    assert not result.stepped and result.grad_norm != result.grad_norm  # nan
    assert all(torch.equal(before[k], v) for k, v in engine.module.state_dict().items())
    assert not engine.optimizer.state  # Adam moments untouched
    assert all(p.grad is None for p in engine.module.parameters())


def test_param_and_optimizer_offload_round_trip(tiny_model_dir):
    plain = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    offl = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(param_offload=True, optimizer_offload=True), optim_cfg())
    assert not offl._params_on_device and not offl._optimizer_on_device
    for seed in range(2):
        for engine in (plain, offl):
            with engine.on_device(with_optimizer=True):
                assert engine._params_on_device and engine._optimizer_on_device
                _train_step(engine, seed)
    assert not offl._params_on_device and not offl._optimizer_on_device
    for (k, a), b in zip(plain.module.state_dict().items(), offl.module.state_dict().values()):
        assert torch.equal(a, b), k
    for sa, sb in zip(plain.optimizer.state.values(), offl.optimizer.state.values()):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])


def test_checkpoint_round_trip_gives_the_identical_next_update(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    engine = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    for seed in range(3):
        _train_step(engine, seed)
    path = str(tmp_path / "global_step_3" / "actor")
    save_engine_checkpoint(engine, path, tok, ["model", "optimizer", "extra", "hf_model"])
    assert sorted(f for f in os.listdir(path) if f.endswith(".pt")) == [
        "extra_state_world_size_1_rank_0.pt", "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt"]
    at_save = {k: v.clone() for k, v in engine.module.state_dict().items()}
    noise_before = torch.rand(3)
    _train_step(engine, 10)
    expected = {k: v.clone() for k, v in engine.module.state_dict().items()}
    expected_lr = engine.current_lr()

    fresh = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    load_engine_checkpoint(fresh, path)
    assert torch.equal(torch.rand(3), noise_before)  # RNG restored to the save point
    _train_step(fresh, 10)
    assert fresh.current_lr() == expected_lr
    for k, v in fresh.module.state_dict().items():
        assert torch.equal(v, expected[k]), k

    exported = load_causal_lm(os.path.join(path, "huggingface")).state_dict()  # weights at save time
    assert all(torch.equal(exported[k], v) for k, v in at_save.items())
    assert load_tokenizer(os.path.join(path, "huggingface")).chat_template


def test_loading_with_another_world_size_is_a_clear_error(tiny_model_dir, tmp_path):
    engine = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    (tmp_path / "model_world_size_2_rank_0.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="world size"):
        load_engine_checkpoint(engine, str(tmp_path))


def test_a_checkpoint_of_another_model_names_the_folder_the_parameter_and_both_shapes(tiny_model_dir, nano_model_dir,
                                                                                       tmp_path):
    """Issue 34: torch's raw size-mismatch traceback named no folder."""
    path = str(tmp_path / "global_step_2" / "actor")
    save_engine_checkpoint(TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg()), path)
    other = TrainEngine(load_causal_lm(nano_model_dir), fsdp_cfg(), optim_cfg())
    with pytest.raises(CheckpointMismatchError) as err:
        load_engine_checkpoint(other, path, field="actor_rollout_ref.actor.checkpoint.load_contents")
    text = str(err.value)
    assert f"checkpoint {path} does not fit this model: parameter 'model.embed_tokens.weight' has shape" in text
    saved = load_causal_lm(tiny_model_dir).model.embed_tokens.weight.shape
    own = other.module.model.embed_tokens.weight.shape
    assert f"{tuple(saved)} in the checkpoint and {tuple(own)} in the model" in text
    assert "actor_rollout_ref.actor's model path" in text and "trainer.resume_mode=disable" in text


def test_lora_export_is_merged(tiny_model_dir, tmp_path):
    model = apply_lora(load_causal_lm(tiny_model_dir), lora_rank=4, lora_alpha=8)
    engine = TrainEngine(model, fsdp_cfg(), optim_cfg(lr=5e-2, lr_warmup_steps=-1, lr_scheduler_type="constant"))
    for seed in range(2):
        _train_step(engine, seed)
    save_engine_checkpoint(engine, str(tmp_path), None, ["model", "hf_model"])
    merged = load_causal_lm(str(tmp_path / "huggingface")).eval()
    assert os.path.isdir(tmp_path / "huggingface" / "lora_adapter")
    ids = torch.randint(5, merged.config.vocab_size, (2, 6))
    engine.module.eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, engine.module(input_ids=ids).logits, atol=1e-5)
        base = load_causal_lm(tiny_model_dir).eval()
        assert not torch.allclose(base(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4)


def test_checkpoint_strict_false_loads_the_tensors_both_have(tiny_model_dir, tmp_path):
    """verl's actor.checkpoint.strict=false: a checkpoint lacking a tensor of the model (and holding one the model has
    not) loads what both have; the rest keep their values and are named in a warning; strict=true refuses it."""
    engine = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    _train_step(engine, 0)
    path = str(tmp_path / "global_step_1" / "actor")
    save_engine_checkpoint(engine, path)
    saved = os.path.join(path, "model_world_size_1_rank_0.pt")
    state = torch.load(saved, weights_only=True)
    dropped = "model.norm.weight"
    state.pop(dropped)
    state["mtp.layers.0.proj.weight"] = torch.zeros(2, 2)  # a tensor this model has not
    torch.save(state, saved)
    fresh = TrainEngine(load_causal_lm(tiny_model_dir), fsdp_cfg(), optim_cfg())
    with pytest.raises(CheckpointMismatchError, match=r"or set actor_rollout_ref.actor.checkpoint.strict=false"):
        load_engine_checkpoint(fresh, path, field="actor_rollout_ref.actor.checkpoint.load_contents")
    before = fresh.module.state_dict()[dropped].clone()
    with pytest.warns(UserWarning, match=r"checkpoint.strict=false: 1 of the model's tensors are not in .* "
                                         r"\['model.norm.weight'\]; 1 of its tensors are not in the model"):
        load_engine_checkpoint(fresh, path, field="actor_rollout_ref.actor.checkpoint.load_contents", strict=False)
    after = fresh.module.state_dict()
    assert torch.equal(after[dropped], before)  # kept its own value
    for name, value in state.items():
        if name in after:
            assert torch.equal(after[name], value), name
    assert not fresh.optimizer.state  # the optimizer state belongs to the other set of tensors: afresh
