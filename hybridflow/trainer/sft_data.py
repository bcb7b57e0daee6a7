"""SFT examples -> token ids with a loss mask that covers assistant tokens only.

Single-turn rows carry a prompt (chat messages or plain text, ``data.prompt_key``) and a response string
(``data.response_key``); multi-turn rows carry ``data.multiturn.messages_key`` (a chat).  Loss only on what the
assistant says (Ouyang et al. 2022, InstructGPT SFT; verl's ``loss_mask``): the model should learn to answer,
not to predict the user's text.

For a chat, each assistant turn's tokens are found by rendering the chat template on the prefix before the
turn (with the generation prompt) and on the prefix including it: the tokens in between are the assistant's
content plus the template's end-of-turn marker, which the model must learn to emit to stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


class SFTDataError(ValueError):
    """A row cannot be turned into an SFT example; the message names the row and the key."""


@dataclass
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]


def _as_messages(prompt: Any, where: str) -> list[dict[str, str]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise SFTDataError(f"{where}: the prompt must be a string or a list of {{role, content}} messages, got {type(prompt).__name__}")


def _render(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def single_turn_example(tokenizer, prompt: Any, response: str, where: str) -> SFTExample:
    """Prompt rendered with the chat template + response + EOS; loss on response and EOS."""
    if not isinstance(response, str):
        raise SFTDataError(f"{where}: the response must be a string, got {type(response).__name__}")
    prompt_ids = _render(tokenizer, _as_messages(prompt, where), add_generation_prompt=True)
    response_ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
    return SFTExample(prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids))


def multi_turn_example(tokenizer, messages: Any, where: str) -> SFTExample:
    """The whole chat; loss on every assistant turn (content + end-of-turn tokens)."""
    messages = _as_messages(messages, where)
    if not any(m["role"] == "assistant" for m in messages):
        raise SFTDataError(f"{where}: the chat has no assistant message, so there is nothing to learn")
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            before = _render(tokenizer, messages[:i], add_generation_prompt=True) if i else []
        else:
            before = None
        full = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        if full[: len(ids)] != ids:
            raise SFTDataError(
                f"{where}: the chat template does not render turn {i} as an extension of the previous turns; "
                "multi-turn SFT needs a prefix-stable template (e.g. ChatML)"
            )
        if before is not None:
            head = len(before) - len(ids)  # the generation prompt ("<|im_start|>assistant\n")
            new = full[len(ids):]
            ids.extend(new)
            mask.extend([0] * head + [1] * (len(new) - head))
        else:
            new = full[len(ids):]
            ids.extend(new)
            mask.extend([0] * len(new))
    return SFTExample(ids, mask)


def truncate_example(ex: SFTExample, max_length: int, truncation: str, where: str) -> SFTExample:
    if len(ex.input_ids) <= max_length:
        return ex
    if truncation == "error":
        raise SFTDataError(
            f"{where}: {len(ex.input_ids)} tokens exceed data.max_length={max_length}; raise max_length or set "
            "data.truncation=left|right"
        )
    if truncation == "left":
        return SFTExample(ex.input_ids[-max_length:], ex.loss_mask[-max_length:])
    if truncation == "right":
        return SFTExample(ex.input_ids[:max_length], ex.loss_mask[:max_length])
    raise SFTDataError(f"data.truncation={truncation!r} is not one of error, left, right")


def collate_sft(examples: list[SFTExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example; the loss mask is shifted to label positions (token t predicts t+1)."""
    width = max(len(e.input_ids) for e in examples)
    n = len(examples)
    input_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.long)
    for i, e in enumerate(examples):
        k = len(e.input_ids)
        input_ids[i, :k] = torch.tensor(e.input_ids)
        attention_mask[i, :k] = 1
        loss_mask[i, : k - 1] = torch.tensor(e.loss_mask[1:])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "loss_mask": loss_mask}


__all__ = ["SFTDataError", "SFTExample", "collate_sft", "multi_turn_example", "single_turn_example", "truncate_example"]
