"""Prompt tokenisation helpers: chat template, truncation to ``max_prompt_length``, left padding.

Truncation modes follow verl's ``data.truncation``: ``error`` (refuse), ``left`` (keep the end, which holds the
question and the generation prompt), ``right`` (keep the beginning), ``middle`` (keep both ends, drop the
middle: the first ``max//2`` and last ``max - max//2`` tokens).
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.data.io import DataFileError

TRUNCATION_MODES = ("error", "left", "right", "middle")


class PromptTooLongError(ValueError):
    """A prompt exceeds ``data.max_prompt_length`` while ``data.truncation=error``."""


def check_chat_messages(prompt: Any, where: str, prompt_key: str) -> list[dict[str, Any]]:
    """``prompt`` as a list of ``{"role", "content"}`` dicts, or a clear error naming the row."""
    if hasattr(prompt, "tolist"):  # numpy arrays from pandas-written parquet
        prompt = prompt.tolist()
    ok = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in prompt
    )
    if not ok:
        shown = repr(prompt)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise DataFileError(
            f"{where}: column '{prompt_key}' must be a non-empty list of chat messages "
            f'[{{"role": "user", "content": "..."}}], got {shown}. Wrap plain text as '
            f'[{{"role": "user", "content": text}}] when preprocessing.'
        )
    for i, message in enumerate(prompt):
        _check_content(message["content"], f"{where}: column '{prompt_key}', message {i} ({message['role']})")
    return prompt


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataFileError(
            f"{where}: the text has a lone surrogate {text[e.start]!r} at character {e.start} (not valid Unicode: "
            "often a JSON '\\ud83d' escape cut from its pair); fix or drop the row when preprocessing") from None


def _check_content(content: Any, where: str) -> None:
    """A message's content: text (valid Unicode), a list of content parts (VLM), or None (a tool call)."""
    if hasattr(content, "tolist") and not isinstance(content, (str, bytes)):
        content = content.tolist()
    if content is None:
        return
    if isinstance(content, str):
        _check_text(content, where)
        return
    if isinstance(content, list):
        for j, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else part if isinstance(part, str) else None
            if isinstance(part, dict) and "text" in part and not isinstance(text, str) and text is not None:
                raise DataFileError(f"{where}, part {j}: 'text' is {type(text).__name__}, expected a string")
            if isinstance(text, str):
                _check_text(text, f"{where}, part {j}")
        return
    shown = repr(content)[:60]
    raise DataFileError(
        f"{where}: content is {type(content).__name__} ({shown}), not text. Decode it when preprocessing "
        "(e.g. content.decode('utf-8')); it would otherwise be trained on as its Python repr")


def truncate(ids: list[int], max_len: int, mode: str, where: str) -> list[int]:
    if len(ids) <= max_len:
        return ids
    if mode == "left":
        return ids[-max_len:]
    if mode == "right":
        return ids[:max_len]
    if mode == "middle":
        head = max_len // 2
        return ids[:head] + ids[len(ids) - (max_len - head) :]
    if mode == "error":
        raise PromptTooLongError(
            f"{where}: prompt is {len(ids)} tokens, longer than data.max_prompt_length={max_len}. Either raise "
            f"data.max_prompt_length, or set data.filter_overlong_prompts=true to drop such rows (or "
            f"data.truncation=left|right|middle to cut them)."
        )
    raise ValueError(f"data.truncation must be one of {', '.join(TRUNCATION_MODES)}, got '{mode}'")


def left_pad(ids: list[int], max_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids``/``attention_mask``/``position_ids`` of shape (max_len,), padding on the left."""
    n_pad = max_len - len(ids)
    input_ids = torch.tensor([pad_id] * n_pad + list(ids), dtype=torch.long)
    attention_mask = torch.tensor([0] * n_pad + [1] * len(ids), dtype=torch.long)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
