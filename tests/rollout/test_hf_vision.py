"""The hf engine generating with images (tiny Qwen2-VL, fp32): prefill with pixels + M-RoPE, decode at
transformers' rope_deltas offset. Checked against HF's own ``generate`` and against a full forward."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from PIL import Image

from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.engine.transformers_adapter import reset_rope_deltas

_SHAPES = [(32, 48), (48, 32), (32, 32), (48, 48)]


def _image(seed: int) -> Image.Image:
    h, w = _SHAPES[seed % len(_SHAPES)]
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def vlm(varied_vlm_dir):
    from transformers import AutoModelForImageTextToText

    from hybridflow.utils.hf_processor import load_processor

    model = AutoModelForImageTextToText.from_pretrained(varied_vlm_dir, dtype=torch.float32,
                                                        attn_implementation="sdpa").eval()
    return model, load_processor(varied_vlm_dir)


def _prompt(processor, images, text):
    content = [{"type": "text", "text": "look"}] + [{"type": "image", "image": im} for im in images]
    content.append({"type": "text", "text": text})
    rendered = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
    return processor(text=[rendered], images=images or None, return_tensors="pt")


def _cases(processor):
    """Image prompts of different sizes and image counts, and one text prompt, batched together."""
    return [
        ([_image(0)], "colour?"),
        ([_image(1)], "what is the shape?"),
        ([_image(2), _image(3)], "compare"),
        ([], "no image here"),
    ]


def _hf_greedy(model, inputs, steps):
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=steps, do_sample=False, eos_token_id=[], output_logits=True,
                             suppress_tokens=[model.config.image_token_id, model.config.video_token_id],
                             return_dict_in_generate=True)
    n = inputs["input_ids"].shape[1]
    tokens = out.sequences[0, n:].tolist()
    log_probs = [torch.log_softmax(step[0].float(), -1)[t].item() for step, t in zip(out.logits, tokens)]
    return tokens, log_probs


def test_greedy_tokens_and_log_probs_equal_hf_generate(vlm):
    model, processor = vlm
    cases = _cases(processor)
    inputs = [_prompt(processor, images, text) for images, text in cases]
    engine = HFRolloutEngine(model, processor.tokenizer, processor=processor)
    steps = 12
    params = SamplingParams(do_sample=False, max_tokens=steps, ignore_eos=True, logprobs=True)
    outs = engine.generate_batch([x["input_ids"][0].tolist() for x in inputs], params,
                                 [{"image": images} if images else None for images, _ in cases])
    distinct = set()
    for (images, _), x, out in zip(cases, inputs, outs):
        want, want_lp = _hf_greedy(model, x, steps)
        assert out.token_ids == want
        np.testing.assert_allclose(out.log_probs, want_lp, atol=1e-5, rtol=0)
        distinct.add(tuple(want))
    assert len(distinct) == len(cases)  # the outputs differ by prompt: the comparison is not vacuous
    assert engine.stats()["prefix_hits"] == 0


def test_the_image_changes_the_output_and_identical_pixels_share_a_prefill(vlm):
    """Same tokens, other pixels -> other log-probs (the prefill really sees the pixels); n copies of one
    image prompt share one prefill, two images of the same size do not."""
    model, processor = vlm
    a, b = _image(0), _image(4)  # same size: identical prompt token ids
    ids_a = _prompt(processor, [a], "colour?")["input_ids"][0].tolist()
    assert ids_a == _prompt(processor, [b], "colour?")["input_ids"][0].tolist()
    engine = HFRolloutEngine(model, processor.tokenizer, processor=processor, enable_prefix_caching=False)
    params = SamplingParams(do_sample=False, max_tokens=6, ignore_eos=True, logprobs=True)
    outs = engine.generate_batch([ids_a] * 3, params, [{"image": [a]}, {"image": [b]}, {"image": [a]}])
    assert outs[0].token_ids == outs[2].token_ids and outs[0].log_probs == outs[2].log_probs
    assert outs[0].log_probs != outs[1].log_probs
    assert engine.stats()["shared_prefill_tokens"] == len(ids_a)  # the two copies of image a only


def test_sampled_log_probs_equal_a_full_forward(vlm):
    """Temperature-1 samples (async path, concurrent requests): each token's log-prob is the model's at that
    position in one forward over prompt + response with the same pixels (what the actor recomputes)."""
    model, processor = vlm
    cases = _cases(processor)[:3]
    engine = HFRolloutEngine(model, processor.tokenizer, processor=processor, seed=3)
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, logprobs=True, seed=11)

    async def run():
        return await asyncio.gather(*(
            engine.generate(_prompt(processor, images, text)["input_ids"][0].tolist(), params, f"r{i}",
                            multi_modal_data={"image": images})
            for i, (images, text) in enumerate(cases)))

    outs = asyncio.run(run())
    for (images, text), out in zip(cases, outs):
        x = _prompt(processor, images, text)
        n = x["input_ids"].shape[1]
        full = torch.cat([x["input_ids"], torch.tensor([out.token_ids])], dim=1)
        with torch.no_grad():
            logits = model(input_ids=full, attention_mask=torch.ones_like(full), pixel_values=x["pixel_values"],
                           image_grid_thw=x["image_grid_thw"], mm_token_type_ids=x["mm_token_type_ids"].new_zeros(
                               full.shape).masked_fill_(full == model.config.image_token_id, 1)).logits
        reset_rope_deltas(model)  # the model caches them between calls
        want = torch.log_softmax(logits[0, n - 1:-1], -1).gather(-1, full[0, n:, None])[:, 0]
        np.testing.assert_allclose(out.log_probs, want.tolist(), atol=1e-5, rtol=0)


def test_bad_image_requests_name_the_fix(vlm, model_and_tokenizer):
    model, processor = vlm
    engine = HFRolloutEngine(model, processor.tokenizer, processor=processor)
    params = SamplingParams(do_sample=False, max_tokens=2)
    ids = _prompt(processor, [_image(0)], "x")["input_ids"][0].tolist()
    with pytest.raises(ValueError, match="image tokens .* but no images came with it"):
        engine.generate_batch([ids], params)
    with pytest.raises(ValueError, match="holds 6 image tokens .* 2 image.* need 12.*render the prompt"):
        engine.generate_batch([ids], params, [{"image": [_image(0), _image(0)]}])
    with pytest.raises(NotImplementedError, match="not videos"):
        engine.generate_batch([ids], params, [{"video": [[_image(0)]]}])
    with pytest.raises(ValueError, match="unknown keys"):
        engine.generate_batch([ids], params, [{"pictures": [_image(0)]}])
    text_model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="text-only"):
        HFRolloutEngine(text_model, tok).generate_batch([[1, 2, 3]], params, [{"image": [_image(0)]}])


def test_fast_decode_runs_the_vlm_language_model_exactly(vlm):
    """The lean decode step covers Qwen2-VL's language model (positions column + rope_delta): same tokens and
    log-probs as decoding through the model's forward."""
    model, processor = vlm
    cases = _cases(processor)
    prompts = [_prompt(processor, images, text)["input_ids"][0].tolist() for images, text in cases]
    media = [{"image": images} if images else None for images, _ in cases]
    params = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, logprobs=True, seed=5)
    fast = HFRolloutEngine(model, processor.tokenizer, processor=processor)
    slow = HFRolloutEngine(model, processor.tokenizer, processor=processor, fast_decode=False)
    assert fast._batcher.fast is not None, fast._batcher.fast_reason
    for a, b in zip(fast.generate_batch(prompts, params, media), slow.generate_batch(prompts, params, media)):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.log_probs, b.log_probs, atol=1e-5, rtol=0)
