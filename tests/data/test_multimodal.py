"""verl multimodal rows through the RL dataset: placeholders, images, processor prompts, batch layout, bad input."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from hybridflow.data.collate import collate_fn
from hybridflow.data.io import write_parquet
from hybridflow.data.multimodal import MultimodalDataError, build_messages, load_image
from hybridflow.data.rl_dataset import RLHFDataset
from hybridflow.data.vision_task import make_vision_rows
from hybridflow.protocol import DataProto


@pytest.fixture(scope="module")
def processor(tiny_vlm_dir):
    from hybridflow.utils.hf_processor import load_processor

    return load_processor(tiny_vlm_dir)


def _png(h=32, w=32, seed=0) -> bytes:
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _row(content: str, images, i: int = 0) -> dict:
    return {"data_source": "synthetic/vision_shape_color", "prompt": [{"role": "user", "content": content}],
            "images": images, "ability": "vision", "reward_model": {"style": "rule", "ground_truth": "red"},
            "extra_info": {"index": i}}


def _dataset(tmp_path, rows, processor, data_cfg, name="d.parquet"):
    path = write_parquet(rows, str(tmp_path / name))
    return RLHFDataset(path, processor.tokenizer, data_cfg, processor=processor)


def test_placeholders_become_image_items_in_order():
    a, b = Image.new("RGB", (4, 4), "red"), Image.new("RGB", (4, 4), "blue")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "A<image>B <image>"}]
    out = build_messages(msgs, [a, b], [])
    assert out[0]["content"] == "be brief"
    assert [c["type"] for c in out[1]["content"]] == ["text", "image", "text", "image"]
    assert out[1]["content"][1]["image"] is a and out[1]["content"][3]["image"] is b
    assert msgs[1]["content"] == "A<image>B <image>"  # input untouched


def test_item_layout_counts_image_tokens(tmp_path, processor, data_cfg):
    data_cfg.max_prompt_length = 96
    rows = [_row("<image>one image", [{"bytes": _png(32, 32), "path": None}], 0),
            _row("two <image> and <image>", [{"bytes": _png(32, 64, 1), "path": None}, {"bytes": _png(64, 32, 2)}], 1),
            _row("text only", [], 2)]
    ds = _dataset(tmp_path, rows, processor, data_cfg)
    image_id = processor.image_token_id
    item = ds[1]
    ids = item["raw_prompt_ids"]
    mm = item["multi_modal_inputs"]
    # 32x64 and 64x32 images in 8-px patches merged 2x2: 8 + 8 image tokens counted in the prompt length
    assert mm["image_grid_thw"].tolist() == [[1, 4, 8], [1, 8, 4]]
    assert sum(t == image_id for t in ids) == 16
    assert mm["pixel_values"].shape == (64, 3 * 2 * 8 * 8)
    assert len(item["multi_modal_data"]["image"]) == 2
    assert item["input_ids"].shape == (96,) and item["position_ids"].shape == (4, 96)
    assert torch.equal(item["input_ids"][-len(ids):], torch.tensor(ids))
    assert "images" not in item  # the raw bytes are not carried twice
    assert [c["type"] for c in item["raw_prompt"][0]["content"]] == ["text", "image", "text", "image"]
    text_item = ds[2]
    assert text_item["multi_modal_inputs"] == {} and text_item["position_ids"].shape == (4, 96)
    batch = DataProto.from_single_dict(collate_fn([ds[0], ds[1], ds[2]]))
    assert batch.batch["position_ids"].shape == (3, 4, 96)
    assert batch.non_tensor_batch["multi_modal_inputs"][1]["image_grid_thw"].shape == (2, 3)


def test_max_prompt_length_counts_image_tokens(tmp_path, processor, data_cfg):
    rows = [_row("<image>hi", [{"bytes": _png(64, 64)}])]  # 16 image tokens + 23 other tokens
    data_cfg.max_prompt_length = 30
    with pytest.raises(ValueError, match="longer than data.max_prompt_length=30"):
        _dataset(tmp_path, rows, processor, data_cfg)[0]
    data_cfg.truncation = "left"
    with pytest.raises(MultimodalDataError, match="would cut image tokens"):
        _dataset(tmp_path, rows, processor, data_cfg)[0]
    data_cfg.truncation, data_cfg.filter_overlong_prompts = "error", True
    with pytest.raises(ValueError, match="removed all 1 rows"):
        _dataset(tmp_path, rows, processor, data_cfg)


def test_image_forms_paths_pil_bytes(tmp_path, processor, data_cfg):
    data_cfg.max_prompt_length = 64
    file = tmp_path / "img.png"
    file.write_bytes(_png(seed=3))
    for images in ([{"bytes": None, "path": str(file)}], [str(file)], [_png(seed=3)]):
        item = _dataset(tmp_path, [_row("<image>x", images)], processor, data_cfg)[0]
        assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    direct = load_image(Image.open(file), "row 0", "images[0]")
    assert direct.mode == "RGB" and direct.size == (32, 32)


@pytest.mark.parametrize("content,images,match", [
    ("<image><image>two marks", [{"bytes": _png()}], "2 <image> placeholder\\(s\\) but column 'images' holds 1"),
    ("no mark", [{"bytes": _png()}], "0 <image> placeholder\\(s\\) but column 'images' holds 1"),
    ("<image>x", [{"bytes": None, "path": None}], "item 0 has neither image bytes nor a path"),
    ("<image>x", [{"bytes": b"not a png at all"}], "item 0 cannot be decoded as an image"),
    ("<image>x", [{"path": "/nonexistent/img.png"}], "does not exist"),
])
def test_bad_rows_name_row_field_and_fix(tmp_path, processor, data_cfg, content, images, match):
    rows = [_row("<image>fine", [{"bytes": _png()}]), _row(content, images, 1)]
    with pytest.raises(MultimodalDataError, match=match) as err:
        _dataset(tmp_path, rows, processor, data_cfg)
    assert "row 1 of" in str(err.value)


def test_text_only_model_given_images(tmp_path, bpe_tokenizer, data_cfg):
    path = write_parquet([_row("<image>x", [{"bytes": _png()}])], str(tmp_path / "d.parquet"))
    with pytest.raises(MultimodalDataError, match="row 0 of .*column 'images' holds 1 image.*no multimodal processor"):
        RLHFDataset(path, bpe_tokenizer, data_cfg)


def test_processor_without_chat_template(tmp_path, data_cfg):
    from hybridflow.utils.hf_processor import load_processor
    from hybridflow.utils.tiny_vlm import make_tiny_vlm_checkpoint

    no_template = load_processor(str(make_tiny_vlm_checkpoint(tmp_path / "m", chat_template=None)))
    with pytest.raises(MultimodalDataError, match="no chat template.*custom_chat_template"):
        _dataset(tmp_path, [_row("<image>x", [{"bytes": _png()}])], no_template, data_cfg)


def test_return_multi_modal_inputs_false(tmp_path, processor, data_cfg):
    data_cfg.return_multi_modal_inputs = False
    item = _dataset(tmp_path, [_row("<image>x", [{"bytes": _png()}])], processor, data_cfg)[0]
    assert "multi_modal_inputs" not in item and len(item["multi_modal_data"]["image"]) == 1


def test_synthetic_vision_rows_are_deterministic_and_decodable(tmp_path, processor, data_cfg):
    rows = make_vision_rows("shape_color", 6, seed=0, split="train")
    assert rows == make_vision_rows("shape_color", 6, seed=0, split="train")
    assert {r["reward_model"]["ground_truth"] for r in make_vision_rows("shape_color", 40, 0, "train")} == {
        "red", "green", "blue", "yellow"}
    counts = make_vision_rows("shape_count", 40, 0, "train")
    assert {r["reward_model"]["ground_truth"] for r in counts} == {"1", "2", "3", "4"}
    data_cfg.max_prompt_length = 64
    item = _dataset(tmp_path, rows, processor, data_cfg)[0]
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
