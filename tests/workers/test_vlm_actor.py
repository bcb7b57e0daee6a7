"""The tiny Qwen2-VL through ActorRolloutRefWorker on one rank: log-probs with pixel inputs, PPO update,
``freeze_vision_tower``, LoRA on the language model only, checkpoint save/load, ``hybridflow merge``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("vlm_batches", Path(__file__).parents[1] / "engine" / "vlm_batches.py")
vlm_batches = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vlm_batches)

VLM = ["data.max_prompt_length=56"]


def _worker(config_factory, model_dir, *overrides):
    from hybridflow.workers.actor_rollout_ref import ActorRolloutRefWorker

    cfg = config_factory(model_dir, *VLM, *overrides)
    worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor_rollout_ref")
    worker.init_model()
    return worker


def _update(worker, seed=0, text_only_rows=(3,)):

    module = worker.actor_engine.module
    data = vlm_batches.make_vlm_update_batch(worker.processor, module.config, seed=seed, text_only_rows=text_only_rows)
    data = data.union(worker.compute_log_prob(data))
    return worker.update_actor(data).meta_info["metrics"], data


def _split(state):
    vision = {k: v for k, v in state.items() if ".visual." in k}
    return vision, {k: v for k, v in state.items() if k not in vision}


@pytest.mark.parametrize("freeze", [True, False])
def test_update_and_freeze_vision_tower(tiny_vlm_dir, config_factory, freeze):
    worker = _worker(config_factory, tiny_vlm_dir, f"actor_rollout_ref.actor.freeze_vision_tower={freeze}")
    assert type(worker.actor_engine.module).__name__ == "Qwen2VLForConditionalGeneration"
    before_vision, before_lm = _split(worker.actor_engine.full_state_dict())
    assert before_vision
    metrics, data = _update(worker)
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"])).all()
    after_vision, after_lm = _split(worker.actor_engine.full_state_dict())
    assert any(not torch.equal(before_lm[k], after_lm[k]) for k in before_lm)
    vision_same = all(torch.equal(before_vision[k], after_vision[k]) for k in before_vision)
    assert vision_same is freeze  # frozen: bit-identical; trained: the pixels' gradient moved the tower
    # the recomputed old log-probs are the HF model's own, pixels included
    module = worker.actor_engine.module
    module.eval()
    fresh = vlm_batches.make_vlm_update_batch(worker.processor, module.config, seed=5, text_only_rows=(3,))
    fresh.meta_info["temperature"] = 1.0
    with torch.no_grad():
        want = vlm_batches.hf_reference_log_probs(module, worker.processor, fresh)
    got = worker.compute_log_prob(fresh).batch["old_log_probs"]
    mask = fresh.batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)


def test_freeze_vision_tower_on_a_text_model_is_refused(tiny_model_dir, config_factory):
    with pytest.raises(ValueError, match="freeze_vision_tower=true but the model .* has no vision tower"):
        _worker(config_factory, tiny_model_dir, "actor_rollout_ref.actor.freeze_vision_tower=true")


def test_lora_adapts_the_language_model_only(tiny_vlm_dir, config_factory):
    worker = _worker(config_factory, tiny_vlm_dir, "actor_rollout_ref.model.lora_rank=4",
                     "actor_rollout_ref.model.lora_alpha=8", "actor_rollout_ref.model.target_modules=all-linear")
    names = [n for n, p in worker.actor_engine.module.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert not any(".visual." in n for n in names)
    assert any(".language_model." in n for n in names)
    data = vlm_batches.make_vlm_update_batch(worker.processor, worker.actor_engine.module.config, seed=1)
    ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]  # adapters disabled = the base VLM
    actor = worker.compute_log_prob(data).batch["old_log_probs"]
    torch.testing.assert_close(ref, actor)  # fresh adapters (B = 0) change nothing yet
    _update(worker)
    moved = worker.compute_log_prob(data).batch["old_log_probs"]
    assert not torch.allclose(moved, ref)


@pytest.mark.slow
def test_checkpoint_round_trip_and_merge_give_the_same_logits(tiny_vlm_dir, config_factory, tmp_path):
    from transformers import AutoModelForImageTextToText

    from hybridflow.cli.merge import merge_checkpoint
    from hybridflow.utils.hf_processor import load_processor

    worker = _worker(config_factory, tiny_vlm_dir)
    _update(worker, seed=0)
    ckpt = tmp_path / "global_step_1" / "actor"
    worker.save_checkpoint(str(ckpt), global_step=1)
    trained = worker.actor_engine.full_state_dict()
    _update(worker, seed=1)
    worker.load_checkpoint(str(ckpt))
    restored = worker.actor_engine.full_state_dict()
    assert all(torch.equal(trained[k], restored[k]) for k in trained)

    out = merge_checkpoint(str(tmp_path / "global_step_1"), str(tmp_path / "merged"))
    merged = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    processor = load_processor(out)
    assert processor is not None and processor.chat_template
    data = vlm_batches.make_vlm_rollout_batch(processor, merged.config, rows=3, seed=4)
    module = worker.actor_engine.module
    module.eval()
    with torch.no_grad():
        got = vlm_batches.hf_reference_log_probs(merged, processor, data)
        want = vlm_batches.hf_reference_log_probs(module, worker.processor, data)
        base = vlm_batches.hf_reference_log_probs(
            AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32), processor, data)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, base)
