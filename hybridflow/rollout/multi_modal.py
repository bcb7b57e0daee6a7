"""The images and videos of a request, as every engine receives them (verl's ``multi_modal_data``).

A request's ``multi_modal_data`` is ``{"image": [PIL images], "video": [...]}`` in placeholder order (verl's names;
``"images"``/``"videos"`` are accepted too).  Each engine turns them into its own inputs (the ``hf`` engine runs
the checkpoint's image processor, vLLM takes them as ``multi_modal_data``); this module only reads the dict.
"""

from __future__ import annotations

from typing import Any

__all__ = ["images_of"]

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
