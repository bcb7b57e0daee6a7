"""GRPO on a vision-language model end to end: the tiny Qwen2-VL on the synthetic visual task (images in the
prompts, pixels in the rollout and the actor), on the local backend and on Ray; exact resume and
``hybridflow merge`` of a VLM checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.trainer import run_checkpoint as ckpt

from .conftest import run, small_overrides

A = "actor_rollout_ref"
VLM = ["data.max_prompt_length=64", "algorithm.adv_estimator=grpo", f"{A}.actor.use_kl_loss=true",
       f"{A}.rollout.calculate_log_probs=true", "reward_model.num_workers=0"]
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/")


@pytest.fixture(scope="module")
def vision_data(tmp_path_factory):
    from hybridflow.data.vision_task import write_vision_task

    d = tmp_path_factory.mktemp("vision_task")
    write_vision_task("shape_color", str(d), train_size=16, test_size=8, seed=0, size=32)
    return d


def _steps(history):
    return [m for m in history.metrics if "timing_s/step" in m]


def _check_run(history, steps=2):
    got = _steps(history)
    assert [m["step"] for m in got] == list(range(1, steps + 1))
    for m in got:
        # the rollout sampled with the same pixels the actor recomputes with
        assert m["training/rollout_probs_diff_max"] < 1e-5
        assert torch.isfinite(torch.tensor([m["actor/pg_loss"], m["actor/kl_loss"]])).all()
        assert m["response_length/mean"] > 0


def test_vlm_grpo_two_steps_local(varied_vlm_dir, vision_data, tmp_path):
    history = run(small_overrides(varied_vlm_dir, vision_data, tmp_path, steps=2, n=4, batch=4,
                                  extra=[*VLM, "trainer.val_before_train=true"]), tmp_path)
    _check_run(history)
    val = [m for m in history.metrics if any(k.startswith("val-core/") for k in m)]
    assert val and "val-core/synthetic/vision_shape_color/reward/mean@1" in val[0]  # grouped by row, not text


SPLIT = [f"{A}.hybrid_engine=false"]
PLACEMENTS = {
    "split": SPLIT,  # standalone hf replicas (they load the processor) fed weights by the checkpoint engine
    "one_step_off": SPLIT + ["async_training.mode=one_step_off"],
    "fully_async": SPLIT + ["async_training.mode=fully_async", f"{A}.rollout.free_cache_engine=false",
                            "data.train_batch_size=0"],
}


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_vlm_grpo_on_standalone_replicas_and_async(placement, varied_vlm_dir, vision_data, tmp_path):
    history = run(small_overrides(varied_vlm_dir, vision_data, tmp_path, steps=2, n=4, batch=4,
                                  extra=[*VLM, *PLACEMENTS[placement]]), tmp_path)
    steps = _steps(history)
    assert len(steps) == 2
    for m in steps:
        assert torch.isfinite(torch.tensor([m["actor/pg_loss"], m["training/rollout_probs_diff_max"]])).all()
    if placement == "split":  # synchronous: the replica sampled with the actor's current weights and pixels
        assert all(m["timing_s/update_weights"] > 0 for m in steps)  # a separate model, synced every step
        assert all(m["training/rollout_probs_diff_max"] < 1e-5 for m in steps)


@pytest.mark.slow
@pytest.mark.ray
def test_vlm_grpo_two_steps_ray(ray_cluster, varied_vlm_dir, vision_data, tmp_path):
    """Two CPU ranks under Ray: the agent-loop workers load the processor themselves, the pixels travel
    with the rows, the FSDP ranks run the vision tower on every micro-batch."""
    history = run(small_overrides(varied_vlm_dir, vision_data, tmp_path, backend="ray", steps=2, n=2, batch=4,
                                  extra=[*VLM, f"{A}.actor.ppo_micro_batch_size_per_gpu=2"]), tmp_path)
    _check_run(history)


def _stop_after(k):
    calls = {"n": 0}

    def should_stop():
        calls["n"] += 1
        return calls["n"] >= k

    return should_stop


def test_vlm_resume_is_exact_and_the_merged_checkpoint_loads(varied_vlm_dir, vision_data, tmp_path):
    from transformers import AutoModelForImageTextToText

    from hybridflow.cli.merge import merge_checkpoint
    from hybridflow.utils.hf_processor import load_processor

    extra = [*VLM, "trainer.save_freq=1", f"{A}.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    full = run(small_overrides(varied_vlm_dir, vision_data, full_dir, steps=3, batch=4, extra=extra), full_dir)
    run(small_overrides(varied_vlm_dir, vision_data, part_dir, steps=3, batch=4, extra=extra), part_dir,
        should_stop=_stop_after(2))
    assert ckpt.completed_steps(part_dir / "ckpt")[-1] == 2
    resumed = run(small_overrides(varied_vlm_dir, vision_data, part_dir, steps=3, batch=4, extra=extra), part_dir)
    want, got = _steps(full)[2], _steps(resumed)
    assert [m["step"] for m in got] == [3]
    for key, value in want.items():
        if not key.startswith(VOLATILE):
            assert got[0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key

    step_dir = part_dir / "ckpt" / "global_step_3"
    out = merge_checkpoint(str(step_dir), str(tmp_path / "merged"))
    merged = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.float32)
    reference = AutoModelForImageTextToText.from_pretrained(step_dir / "actor" / "huggingface", dtype=torch.float32)
    base = AutoModelForImageTextToText.from_pretrained(varied_vlm_dir, dtype=torch.float32)
    processor = load_processor(out)
    assert processor is not None and processor.chat_template
    from hybridflow.data.vision_task import make_vision_rows
    from hybridflow.data.multimodal import load_image

    image = load_image(make_vision_rows("shape_color", 1, 9, "test")[0]["images"][0], "row 0", "images[0]")
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image", "image": image},
                                                                       {"type": "text", "text": "colour?"}]}],
                                         add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    with torch.no_grad():
        logits = [m(**inputs).logits for m in (merged, reference, base)]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits[0], logits[2])  # three updates moved the model
    assert (Path(out) / "preprocessor_config.json").is_file() or (Path(out) / "processor_config.json").is_file()
