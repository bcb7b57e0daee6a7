"""Images in agent-loop trajectories: which images a conversation shows, their prompt tokens, their pixels.

A vision-language trajectory keeps its images inside the chat messages, as ``{"type": "image", "image": PIL}``
content items (the dataset's ``raw_prompt`` holds the row's images that way, and a tool whose
``ToolResponse`` carries images adds a tool message with them). The images of a trajectory are those items in
message order, which is also the order of their token runs in ``prompt_ids + response_ids``: the rollout
engine gets them with every model call, and the finished trajectory carries them in
``AgentLoopOutput.multi_modal_data = {"image": [...]}`` so that ``postprocess`` computes the pixel inputs
the actor and the reference recompute log-probs with.

A chat template renders one ``<|image_pad|>`` per image; the processor expands it to the image's
``t x h x w / merge^2`` tokens. Observations are rendered by diffing two template renders
(``chat.render_continuation``), so their image tokens are expanded here the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["message_images", "row_images", "tool_images", "image_token_counts", "expand_image_tokens", "image_message_content"]


def message_images(messages: Sequence[dict[str, Any]]) -> list[Any]:
    """The images of ``messages`` (content-list items of type ``image``), in order."""
    found = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            found += [item["image"] for item in content if isinstance(item, dict) and item.get("type") == "image"]
    return found


def row_images(row: dict[str, Any]) -> list[Any]:
    """A dataset row's images: ``multi_modal_data["image"]`` (what the dataset decoded), else its messages'."""
    data = row.get("multi_modal_data")
    if isinstance(data, dict) and data.get("image"):
        return list(data["image"])
    return message_images(list(row.get("raw_prompt") or []))


def tool_images(tool_name: str, images: Sequence[Any] | None) -> list[Any]:
    """A ``ToolResponse.image`` list as RGB PIL images (bytes, paths and ``{"bytes"|"path"}`` dicts decoded);
    an undecodable one raises an error naming the tool and the item."""
    from hybridflow.data.multimodal import load_image

    return [load_image(image, f"tool {tool_name!r}", f"ToolResponse.image[{k}]") for k, image in enumerate(images or [])]


def image_token_counts(processor: Any, images: Sequence[Any]) -> list[int]:
    """Prompt tokens of each image once the processor expands it (``t * h * w / merge^2``)."""
    if not images:
        return []
    grid = processor.image_processor(images=list(images), return_tensors="pt")["image_grid_thw"]
    merge = int(processor.image_processor.merge_size)
    return [int(v) for v in (grid.prod(dim=-1) // (merge * merge)).tolist()]


def expand_image_tokens(ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """``ids`` with its k-th ``image_token_id`` repeated ``counts[k]`` times (a template render -> model ids)."""
    out: list[int] = []
    k = 0
    for t in ids:
        if t == image_token_id:
            if k >= len(counts):
                raise ValueError(f"the rendered text holds more image tokens than the {len(counts)} image(s) given")
            out += [t] * counts[k]
            k += 1
        else:
            out.append(t)
    if k != len(counts):
        raise ValueError(f"the rendered text holds {k} image token(s) for {len(counts)} image(s); the chat template "
                         "must render each {'type': 'image'} item as one image placeholder")
    return out


def image_message_content(text: str | None, images: Sequence[Any]) -> str | list[dict[str, Any]]:
    """A message content: plain ``text``, or the images followed by the text (verl's tool-message layout)."""
    if not images:
        return text or ""
    content: list[dict[str, Any]] = [{"type": "image", "image": image} for image in images]
    if text:
        content.append({"type": "text", "text": text})
    return content
