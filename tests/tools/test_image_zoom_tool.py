"""``image_zoom_in_tool`` (verl's ImageZoomInTool behaviour) and the helpers that put tool images into a
trajectory: box clamping/growing, crops in original coordinates, errors the model reads, bad images."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from hybridflow.tools import ToolExecutor
from hybridflow.tools.image_zoom_in_tool import ImageZoomInTool, zoom_box


def _image(w=64, h=48):
    return Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("bbox,want", [
    ([8, 4, 40, 36], [8.0, 4.0, 40.0, 36.0]),  # big enough: unchanged
    ([-10, -5, 40, 36], [0.0, 0.0, 40.0, 36.0]),  # clamped to the image
    ([30, 20, 40, 30], [21, 11, 49, 39]),  # 10x10 grown around its centre (35, 25) to 28x28
    ([0, 0, 10, 10], [0, 0, 28, 28]),  # grown, then shifted inside the image
    ([50, 30, 60, 40], [36, 20, 64, 48]),  # near the corner: grown box shifted back inside
    ([50, 30, 60, 48], None),  # 10x18 grown to 28x50 > image height, scaled back to 27x48: too thin (verl too)
])
def test_zoom_box(bbox, want):
    got = zoom_box(bbox, 64, 48)
    assert got == (None if want is None else pytest.approx(want))


@pytest.mark.parametrize("bbox", [[40, 10, 8, 30], [5, 5, 5, 30], [0, 0, 64, 0.5], [100, 100, 120, 120]])
def test_zoom_box_refuses_empty_inverted_thin_or_outside_boxes(bbox):
    assert zoom_box(bbox, 64, 48) is None


def test_zoom_box_refuses_when_the_image_is_smaller_than_the_minimum():
    assert zoom_box([0, 0, 20, 20], 20, 20) is None


def _call(arguments, image):
    executor = ToolExecutor([ImageZoomInTool()])

    async def go():
        session = executor.session({"image_zoom_in_tool": {"create_kwargs": {"image": image}}})
        try:
            return await session.call("image_zoom_in_tool", arguments)
        finally:
            await session.close()

    return asyncio.run(go())


def test_zoom_returns_the_crop_in_original_coordinates():
    image = _image()
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    outcome = _call({"bbox_2d": [8, 4, 40, 36], "label": "cat"}, {"bytes": buf.getvalue()})
    assert outcome.ok and outcome.step_reward == 0.0 and outcome.metrics == {"success": True}
    (crop,) = outcome.response.image
    assert np.array_equal(np.asarray(crop), np.asarray(image)[4:36, 8:40])
    assert outcome.text == "Zoomed in on the image to the region [8, 4, 40, 36] with label cat."


@pytest.mark.parametrize("arguments,match", [
    ({"bbox_2d": [40, 10, 8, 30]}, "invalid or gives a crop smaller than 28x28 pixels \\(the image is 64x48\\)"),
])
def test_bad_boxes_are_answered_with_a_penalty(arguments, match):
    outcome = _call(arguments, _image())
    assert outcome.response.image is None and outcome.step_reward == -0.05
    assert outcome.text.startswith("Error:") and __import__("re").search(match, outcome.text)


def test_malformed_boxes_and_a_missing_image_become_error_observations():
    for bad in ([1, 2, 3], [1, 2, "x", 4], "0,0,30,30"):
        outcome = _call({"bbox_2d": bad}, _image())
        assert outcome.error_kind in (None, "invalid_arguments") and outcome.text.startswith("Error:"), bad
        assert outcome.response.image is None
    outcome = _call({"label": "x"}, _image())
    assert outcome.error_kind == "invalid_arguments" and "bbox_2d" in outcome.text
    outcome = _call({"bbox_2d": [0, 0, 30, 30]}, None)
    assert outcome.error_kind == "tool_exception" and "create_kwargs.image" in outcome.text


def test_tool_images_decode_or_name_the_tool_and_item():
    from hybridflow.agents.trajectory_images import tool_images
    from hybridflow.data.multimodal import MultimodalDataError

    assert tool_images("zoom", None) == []
    (img,) = tool_images("zoom", [_image().convert("L")])
    assert img.mode == "RGB"
    with pytest.raises(MultimodalDataError, match="tool 'zoom': ToolResponse.image\\[1\\] cannot be decoded"):
        tool_images("zoom", [_image(), b"garbage bytes"])


def test_expand_image_tokens_checks_the_counts():
    from hybridflow.agents.trajectory_images import expand_image_tokens

    assert expand_image_tokens([1, 9, 2, 9], 9, [2, 3]) == [1, 9, 9, 2, 9, 9, 9]
    with pytest.raises(ValueError, match="1 image token\\(s\\) for 2 image"):
        expand_image_tokens([1, 9], 9, [2, 3])
    with pytest.raises(ValueError, match="more image tokens than the 1 image"):
        expand_image_tokens([9, 9], 9, [2])


def test_a_text_model_cannot_be_shown_tool_images(tiny_model_dir):
    from transformers import AutoTokenizer

    from hybridflow.agents.chat import render_continuation

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ValueError, match="1 image\\(s\\) to show the model, but it has no multimodal processor"):
        render_continuation(tok, [{"role": "tool", "content": "x"}], [tok.eos_token_id], True, None, images=[_image()])
