"""``image_zoom_in_tool``: crop a region of the sample's image and show it to the model (verl's ImageZoomInTool).

The image comes from the sample's ``tools_kwargs.image_zoom_in_tool.create_kwargs.image`` (a PIL image,
encoded bytes, a ``{"bytes"|"path": ...}`` dict or a file path). A call gives ``bbox_2d = [x1, y1, x2, y2]``
in the *original* image's pixel coordinates (and an optional ``label``); the answer is the cropped region
as a ``ToolResponse`` image plus a short text. The agent loop appends the crop to the conversation through
the processor's chat template, and its pixels join the trajectory's multi-modal inputs.

As verl's tool does: the box is clamped to the image; a box smaller than ``min_dimension`` on a side is grown
around its centre (shifted to stay inside the image) so the vision encoder gets enough pixels; a box that is
empty, inverted or thinner than 1:``max_aspect_ratio`` is refused with an error text and a ``-0.05`` step
reward. Unlike verl's, there is no Ray rate-limiting pool: cropping is a cheap in-process operation here.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, floor
from typing import Any

from hybridflow.tools.base_tool import BaseTool, ExecuteResult, parse_tool_config, register_tool
from hybridflow.tools.schemas import ToolResponse

__all__ = ["ImageZoomInTool", "ImageZoomConfig", "zoom_box"]

_PENALTY = -0.05


@dataclass
class ImageZoomConfig:
    min_dimension: int = 28  # Qwen2-VL's 14-pixel patches merged 2x2
    max_aspect_ratio: float = 100.0
    # verl's pool settings, accepted so verl tool YAML files load unchanged (no pool is used here)
    num_workers: int = 20
    rate_limit: int = 50
    timeout: int = 30
    enable_global_rate_limit: bool = True


def _valid(left: float, top: float, right: float, bottom: float, max_ratio: float) -> bool:
    if not (left < right and top < bottom):
        return False
    w, h = right - left, bottom - top
    return max(w, h) / min(w, h) <= max_ratio


def zoom_box(bbox: list[float], width: int, height: int, min_dim: int = 28,
             max_ratio: float = 100.0) -> list[float] | None:
    """The crop box for ``bbox`` on a ``width x height`` image, or ``None`` when no valid crop exists."""
    left, top = max(0.0, float(bbox[0])), max(0.0, float(bbox[1]))
    right, bottom = min(float(width), float(bbox[2])), min(float(height), float(bbox[3]))
    if not _valid(left, top, right, bottom, max_ratio):
        return None
    box = [left, top, right, bottom]
    w, h = right - left, bottom - top
    if w < min_dim or h < min_dim:  # grow around the centre until the short side is min_dim
        scale = min_dim / min(w, h)
        tw, th = w * scale, h * scale
        if tw > width:
            th, tw = th * width / tw, float(width)
        if th > height:
            tw, th = tw * height / th, float(height)
        x0 = min(max(0.0, (left + right) / 2 - tw / 2), width - tw)
        y0 = min(max(0.0, (top + bottom) / 2 - th / 2), height - th)
        box = [floor(x0), floor(y0), ceil(x0 + tw), ceil(y0 + th)]
    if not _valid(*box, max_ratio):
        return None
    if floor(box[2]) - floor(box[0]) < min_dim or floor(box[3]) - floor(box[1]) < min_dim:
        return None  # the image itself is smaller than min_dim on a side
    return box


@register_tool("image_zoom_in_tool")
class ImageZoomInTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "image_zoom_in_tool",
            "description": ("Zoom in on a region of the image by cropping it to a bounding box, optionally naming "
                            "the object in it."),
            "parameters": {
                "type": "object",
                "properties": {
                    "bbox_2d": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4,
                                "description": "[x1, y1, x2, y2]: top-left and bottom-right corners, in pixels "
                                               "of the original image"},
                    "label": {"type": "string", "description": "the object in the box (optional)"},
                },
                "required": ["bbox_2d"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = parse_tool_config(ImageZoomConfig, self.config, self.name)

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        from hybridflow.data.multimodal import load_image

        instance_id, response = await super().create(instance_id, **kwargs)
        image = self._instances[instance_id]["create_kwargs"].get("image")
        if image is None:
            self._instances.pop(instance_id, None)
            raise ValueError(f"{self.name}: no image to zoom into; give it per sample as extra_info.tools_kwargs."
                             f"{self.name}.create_kwargs.image (PIL image, bytes, {{'bytes'|'path': ...}} or a path)")
        self._instances[instance_id]["image"] = load_image(image, f"{self.name} instance {instance_id}",
                                                           "create_kwargs.image")
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> ExecuteResult:
        bbox = parameters.get("bbox_2d") if isinstance(parameters, dict) else None
        if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox):
            return (ToolResponse(text="Error: bbox_2d must be a list of 4 numbers [x1, y1, x2, y2]."), _PENALTY,
                    {"success": False})
        image = self._instance(instance_id)["image"]
        box = zoom_box(list(bbox), image.width, image.height, self.settings.min_dimension,
                       self.settings.max_aspect_ratio)
        if box is None:
            return (ToolResponse(text=f"Error: the bounding box {list(bbox)} is invalid or gives a crop smaller than "
                                      f"{self.settings.min_dimension}x{self.settings.min_dimension} pixels "
                                      f"(the image is {image.width}x{image.height})."), _PENALTY, {"success": False})
        label = parameters.get("label") or ""
        text = f"Zoomed in on the image to the region {list(bbox)}" + (f" with label {label}." if label else ".")
        return ToolResponse(image=[image.crop(tuple(box))], text=text), 0.0, {"success": True}
