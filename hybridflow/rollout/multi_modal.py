"""The images and videos of a request, as every engine receives them (verl's ``multi_modal_data``), and whether a
checkpoint is a vision-language model (what a text-only engine adapter must refuse).

A request's ``multi_modal_data`` is ``{"image": [PIL images], "video": [...]}`` in placeholder order (verl's names;
``"images"``/``"videos"`` are accepted too).  Each engine turns them into its own inputs (the ``hf`` engine runs
the checkpoint's image processor, vLLM takes them as ``multi_modal_data``); this module only reads the dict.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["images_of", "text_only_engine_error", "vision_model_type"]

_IMAGE_KEYS = ("image", "images")
_VIDEO_KEYS = ("video", "videos")


def images_of(multi_modal_data: Any) -> tuple[list[Any], list[Any]]:
    """(images, videos) of a request's ``multi_modal_data`` (``None`` / empty lists: none)."""
    if multi_modal_data is None:
        return [], []
    if not isinstance(multi_modal_data, dict):
        raise TypeError(f"multi_modal_data must be a dict like {{'image': [PIL images]}}, got "
                        f"{type(multi_modal_data).__name__}")
    unknown = sorted(set(multi_modal_data) - set(_IMAGE_KEYS) - set(_VIDEO_KEYS))
    if unknown:
        raise ValueError(f"multi_modal_data has unknown keys {unknown}; engines take 'image' (a list of PIL "
                         "images) and 'video'")

    def items(keys):
        out: list[Any] = []
        for key in keys:
            value = multi_modal_data.get(key)
            if value is not None:
                out.extend(value if isinstance(value, (list, tuple)) else [value])
        return out

    return items(_IMAGE_KEYS), items(_VIDEO_KEYS)


def vision_model_type(model_path: str) -> str | None:
    """The ``model_type`` of a local vision-language checkpoint (its ``config.json`` has a ``vision_config``),
    else ``None`` (text models, and hub ids without a local folder: the trainer's processor check catches those)."""
    cfg_file = Path(os.path.expanduser(str(model_path))) / "config.json"
    if not cfg_file.is_file():
        return None
    data = json.loads(cfg_file.read_text())
    if not isinstance(data.get("vision_config"), dict):
        return None
    return str(data.get("model_type"))


def text_only_engine_error(model_path: str, engine: str = "sglang") -> str | None:
    """Why the text-only ``engine`` adapter (sglang) cannot roll out the checkpoint at ``model_path``, or ``None``.

    A vision-language checkpoint is refused: the sglang adapter passes no images (docs/vision.md).  The vllm
    adapter generates with images; its checks are :func:`vllm_vision_settings`.
    """
    model_type = vision_model_type(model_path)
    if model_type is None:
        return None
    return (f"actor_rollout_ref.rollout.name={engine}: the model at actor_rollout_ref.model.path={model_path} is a "
            f"vision-language model (model_type {model_type!r}), but the {engine} rollout adapter is text-only here "
            "(it cannot pass images). Set actor_rollout_ref.rollout.name=hf, which generates with images "
            "(docs/vision.md)")
