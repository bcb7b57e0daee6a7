"""M-RoPE positions computed without a model equal the HF model's own ``get_rope_index``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hybridflow.data.mrope import MropeSpec, mrope_positions, model_position_ids, vlm_position_ids


def _image(h: int, w: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def _batch(processor, rows):
    """Left-padded processor batch of chat prompts with ``rows`` = [(text, [images])]."""
    texts = []
    images = []
    for text, imgs in rows:
        content = [{"type": "image"} for _ in imgs] + [{"type": "text", "text": text}]
        texts.append(processor.apply_chat_template([{"role": "user", "content": content}],
                                                   add_generation_prompt=True, tokenize=False))
        images.extend(imgs)
    processor.tokenizer.padding_side = "left"
    return processor(text=texts, images=images or None, return_tensors="pt", padding=True)


@pytest.mark.parametrize("fixture", ["tiny_vlm_dir", "tiny_vlm25_dir"])
def test_positions_equal_hf_get_rope_index(fixture, request):
    from transformers import AutoModelForImageTextToText

    from hybridflow.utils.hf_processor import load_processor

    path = request.getfixturevalue(fixture)
    processor = load_processor(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    rows = [
        ("two images here", [_image(32, 48, 0), _image(64, 32, 1)]),  # non-square grids: h != w
        ("no image at all, only text", []),
        ("one", [_image(40, 40, 2)]),
    ]
    enc = _batch(processor, rows)
    expected, _ = model.model.get_rope_index(enc["input_ids"], enc["mm_token_type_ids"], enc["image_grid_thw"],
                                             attention_mask=enc["attention_mask"])
    spec = MropeSpec.from_hf_config(model.config)
    grids = enc["image_grid_thw"]
    start = 0
    for b, (_, imgs) in enumerate(rows):
        row_grids = grids[start:start + len(imgs)] if imgs else None
        start += len(imgs)
        got = vlm_position_ids(enc["input_ids"][b], enc["attention_mask"][b], spec, row_grids)
        assert torch.equal(got[1:], expected[:, b]), f"row {b}"
        mask = enc["attention_mask"][b].bool()
        assert torch.equal(got[0, mask], torch.arange(int(mask.sum())))


def test_video_temporal_scaling_of_qwen25():
    spec = MropeSpec("qwen2_5_vl", image_token_id=7, video_token_id=8, spatial_merge_size=2, tokens_per_second=2)
    ids = [1, 2] + [8] * (2 * 2 * 2) + [3]
    pos = mrope_positions(ids, spec, video_grid_thw=torch.tensor([[2, 4, 4]]), second_per_grid_ts=[1.5])
    assert pos[0, 2:10].tolist() == [2, 2, 2, 2, 5, 5, 5, 5]  # temporal step = 2 tokens/s x 1.5 s
    assert pos[:, -1].tolist() == [4, 4, 4]  # text resumes at start + max(h, w) / merge
    qwen2 = MropeSpec("qwen2_vl", 7, 8, 2)
    assert mrope_positions(ids, qwen2, video_grid_thw=torch.tensor([[2, 4, 4]]))[0, 2:10].tolist() == [2] * 4 + [3] * 4


def test_mismatched_grids_are_refused():
    spec = MropeSpec("qwen2_vl", 7, 8, 2)
    with pytest.raises(ValueError, match="more image token runs"):
        mrope_positions([1, 7, 7, 7, 7, 2, 7, 7, 7, 7], spec, torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="does not match its grid"):
        mrope_positions([1, 7, 7, 7, 2], spec, torch.tensor([[1, 4, 4]]))
    with pytest.raises(ValueError, match="2 image_grid_thw rows"):
        mrope_positions([1, 7, 7, 7, 7], spec, torch.tensor([[1, 4, 4], [1, 4, 4]]))


def test_model_position_ids_layouts():
    pos = torch.arange(2 * 4 * 5).view(2, 4, 5)
    assert model_position_ids(pos).shape == (3, 2, 5)
    assert torch.equal(model_position_ids(pos)[0], pos[:, 1])
    assert model_position_ids(pos[:1], packed=True).shape == (4, 1, 5)
    flat = torch.arange(10).view(2, 5)
    assert model_position_ids(flat) is flat


def test_image_only_processor_keeps_the_mrope_spec(tiny_vlm_dir, tmp_path):
    """The image-only subclass ``write_image_only_processor`` ships (for vLLM without torchvision) is still a
    Qwen2-VL processor: without the spec the data pipeline gives the actor 1-D positions, and the rollout and the
    actor disagree (rollout_probs_diff_mean 0.09 on the tiny model)."""
    import shutil

    from hybridflow.data.mrope import spec_from_processor
    from hybridflow.utils.hf_processor import load_processor, write_image_only_processor

    path = shutil.copytree(tiny_vlm_dir, tmp_path / "image_only")
    write_image_only_processor(str(path))
    processor = load_processor(str(path), trust_remote_code=True)
    assert type(processor).__name__ == "ImageOnlyQwen2VLProcessor"
    assert spec_from_processor(processor) == spec_from_processor(load_processor(tiny_vlm_dir))
    assert spec_from_processor(processor) is not None
