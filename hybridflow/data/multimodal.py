"""verl's multimodal rows -> processor inputs: images decoded, ``<image>`` placeholders aligned, prompt rendered.

A verl multimodal row holds its images in a column (``data.image_key``, default ``images``) as a list whose
items are ``{"bytes": ..., "path": ...}`` dicts (how ``datasets`` stores ``Image`` features in parquet), raw
bytes, file paths or PIL images; the prompt's message contents mark where each goes with ``<image>`` (and
``<video>`` for ``data.video_key``). The k-th placeholder takes the k-th image. Here that becomes chat content
lists (``[{"type": "image", "image": PIL}, {"type": "text", "text": ...}]``) that the processor's chat
template renders with the model's vision tokens; the processor then expands each image to its
``t x h x w / merge^2`` tokens and returns the pixel inputs.

Every problem is an error naming the row, the column and the fix: an image with neither bytes nor a path,
bytes that are not an image, more or fewer placeholders than images. Nothing is dropped silently.
"""

from __future__ import annotations

import copy
import io
import os
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from hybridflow.data.io import DataFileError

__all__ = ["IMAGE_PLACEHOLDER", "VIDEO_PLACEHOLDER", "MODEL_INPUT_KEYS", "MultimodalDataError", "ProcessedPrompt",
           "as_media_list", "load_image", "count_placeholders", "build_messages", "process_prompt"]

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
_SPLIT = re.compile(f"({IMAGE_PLACEHOLDER}|{VIDEO_PLACEHOLDER})")
# Keys of ``multi_modal_inputs`` that the model's forward takes (the rest, e.g. second_per_grid_ts, only
# feed the position computation).
MODEL_INPUT_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
_NOT_MODEL_INPUTS = ("input_ids", "attention_mask", "mm_token_type_ids")


class MultimodalDataError(DataFileError):
    """A multimodal row is malformed: missing/corrupt image, placeholders and images disagree, no processor."""


def as_media_list(value: Any) -> list[Any]:
    """A row's image/video cell as a list (``None`` -> [], numpy arrays from parquet -> list, one item -> [item])."""
    if value is None:
        return []
    if hasattr(value, "tolist") and not hasattr(value, "convert"):  # numpy object arrays, not PIL images
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def load_image(value: Any, where: str, field_name: str):
    """A PIL RGB image from verl's image forms; errors name ``where`` (the row) and ``field_name`` (``images[k]``)."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    source = value
    if isinstance(value, dict):
        source = value.get("bytes") or value.get("path") or value.get("image")
        if source is None:
            raise MultimodalDataError(
                f"{where}: {field_name} has neither image bytes nor a path (keys: {sorted(value)}). Store the image "
                "as {'bytes': <encoded PNG/JPEG>} or {'path': <file>} when preprocessing, or drop the row"
            )
        if isinstance(source, Image.Image):
            return source.convert("RGB")
    if isinstance(source, str):
        path = source[len("file://"):] if source.startswith("file://") else source
        if not os.path.isfile(os.path.expanduser(path)):
            raise MultimodalDataError(f"{where}: {field_name} points at '{path}', which does not exist; fix the path "
                                      "(relative paths are resolved from the working directory) or embed the bytes")
        opener: Any = os.path.expanduser(path)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        opener = io.BytesIO(bytes(source))
    else:
        raise MultimodalDataError(f"{where}: {field_name} is a {type(source).__name__}; expected PIL image, encoded "
                                  "bytes, a file path or a {'bytes', 'path'} dict")
    try:
        with Image.open(opener) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise MultimodalDataError(f"{where}: {field_name} cannot be decoded as an image ({type(exc).__name__}: {exc}). "
                                  "The bytes are corrupt or not PNG/JPEG/...; re-encode the image or drop the row") from exc


def count_placeholders(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(``<image>`` count, ``<video>`` count) over the string contents of ``messages``."""
    n_img = n_vid = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            n_img += content.count(IMAGE_PLACEHOLDER)
            n_vid += content.count(VIDEO_PLACEHOLDER)
    return n_img, n_vid


def check_alignment(messages: list[dict[str, Any]], n_images: int, n_videos: int, where: str, prompt_key: str,
                    image_key: str, video_key: str) -> None:
    """Placeholders and media must pair up one to one."""
    n_img, n_vid = count_placeholders(messages)
    for kind, marks, have, key in (("image", n_img, n_images, image_key), ("video", n_vid, n_videos, video_key)):
        if marks == have:
            continue
        tag = IMAGE_PLACEHOLDER if kind == "image" else VIDEO_PLACEHOLDER
        if marks > have:
            fix = f"add the missing {kind}s to column '{key}' or remove the extra {tag} markers"
        else:
            fix = f"put one {tag} in the prompt text where each {kind} belongs (the k-th {tag} takes the k-th {kind})"
        raise MultimodalDataError(f"{where}: column '{prompt_key}' has {marks} {tag} placeholder(s) but column "
                                  f"'{key}' holds {have} {kind}(s); {fix}")


def build_messages(messages: list[dict[str, Any]], images: list[Any], videos: list[Any]) -> list[dict[str, Any]]:
    """Chat messages with each placeholder replaced by a ``{"type": "image"|"video", ...}`` content item.

    ``images`` are decoded PIL images and ``videos`` lists of frames, in placeholder order; messages without
    placeholders keep their string content. The input messages are not modified.
    """
    out = copy.deepcopy(messages)
    if not images and not videos:
        return out
    it_img, it_vid = iter(images), iter(videos)
    for m in out:
        content = m.get("content")
        if not isinstance(content, str) or not _SPLIT.search(content):
            continue
        parts: list[dict[str, Any]] = []
        for seg in _SPLIT.split(content):
            if seg == IMAGE_PLACEHOLDER:
                parts.append({"type": "image", "image": next(it_img)})
            elif seg == VIDEO_PLACEHOLDER:
                parts.append({"type": "video", "video": next(it_vid)})
            elif seg:
                parts.append({"type": "text", "text": seg})
        m["content"] = parts
    return out


@dataclass
class ProcessedPrompt:
    """One prompt through the processor: the model's token ids (vision tokens expanded) and pixel inputs."""

    input_ids: list[int]
    multi_modal_inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    multi_modal_data: dict[str, list[Any]] = field(default_factory=dict)


def process_prompt(processor: Any, messages: list[dict[str, Any]], images: list[Any], videos: list[Any],
                   template_kwargs: dict[str, Any], where: str) -> ProcessedPrompt:
    """Render ``messages`` (content lists from :func:`build_messages`) and run the processor on text + media."""
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    if videos and getattr(processor, "video_processor", None) is None:
        raise MultimodalDataError(
            f"{where}: the row has {len(videos)} video(s) but the processor has no video processor; transformers' "
            "video processors need torchvision (pip install torchvision matching your torch), or drop the videos"
        )
    kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if images:
        kwargs["images"] = images
    if videos:
        kwargs["videos"] = videos
    out = processor(**kwargs)
    ids = out["input_ids"][0].tolist()
    mm_inputs = {k: v for k, v in out.items() if k not in _NOT_MODEL_INPUTS}
    mm_data: dict[str, list[Any]] = {}
    if images:
        mm_data["image"] = images
    if videos:
        mm_data["video"] = videos
    return ProcessedPrompt(ids, mm_inputs, mm_data)
