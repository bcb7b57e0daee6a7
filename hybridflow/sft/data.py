"""SFT examples -> token ids with a loss mask that covers assistant tokens only.

Single-turn rows carry a prompt (chat messages or plain text, ``data.prompt_key``) and a response string
(``data.response_key``); multi-turn rows carry ``data.multiturn.messages_key`` (a chat).  Loss only on what the
assistant says (Ouyang et al. 2022, InstructGPT SFT; verl's ``loss_mask``): the model should learn to answer,
not to predict the user's text.

For a chat, each assistant turn's tokens are found by rendering the chat template on the prefix before the
turn (with the generation prompt) and on the prefix including it: the tokens in between are the assistant's
content plus the template's end-of-turn marker, which the model must learn to emit to stop.

Tool use: assistant messages may carry ``tool_calls`` (OpenAI format, ``arguments`` a dict or JSON text) and
``tool`` messages the results; a row may carry the tool schemas (``data.multiturn.tools_key``, a list or JSON
text) that the template renders into the system turn. The assistant's tool-call text is trained on, like the
rest of its turn; tool results, like user turns, are not. Only the boundaries around assistant turns are
checked for prefix stability, so templates that group consecutive tool messages into one turn work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch


class SFTDataError(ValueError):
    """A row cannot be turned into an SFT example; the message names the row and the key."""


@dataclass
class SFTExample:
    input_ids: list[int]
    loss_mask: list[int]


_MESSAGE_KEYS = ("role", "content", "tool_calls", "name", "tool_call_id")


def _as_messages(prompt: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if hasattr(prompt, "tolist") and not isinstance(prompt, (list, tuple)):
        prompt = prompt.tolist()  # a numpy array read back from parquet
    if isinstance(prompt, (list, tuple)) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
        # parquet fills absent struct fields with None: keep only what the message really has
        messages = [{k: m[k] for k in _MESSAGE_KEYS if m.get(k) is not None} for m in prompt]
        for i, m in enumerate(messages):
            m.setdefault("content", "")
            if "tool_calls" in m:
                m["tool_calls"] = _tool_calls(m["tool_calls"], f"{where}: message {i}")
        return messages
    raise SFTDataError(f"{where}: the prompt must be a string or a list of {{role, content}} messages, got {type(prompt).__name__}")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    calls = calls.tolist() if hasattr(calls, "tolist") else calls
    if not isinstance(calls, (list, tuple)):
        raise SFTDataError(f"{where}: tool_calls must be a list, got {type(calls).__name__}")
    out = []
    for call in calls:
        fn = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise SFTDataError(f"{where}: each tool call needs {{\"function\": {{\"name\": ..., \"arguments\": ...}}}}, "
                               f"got {call!r:.200}")
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as e:
                raise SFTDataError(f"{where}: the arguments of tool call {fn['name']!r} are not valid JSON ({e.msg})") from None
        out.append({"type": "function", "function": {"name": fn["name"], "arguments": arguments or {}}})
    return out


def parse_tools(tools: Any, where: str) -> list[dict] | None:
    """A row's tool schemas (list of dicts, or JSON text of one) -> list, or None when the row has none."""
    if tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise SFTDataError(f"{where}: the tools column is not valid JSON ({e.msg})") from None
    tools = tools.tolist() if hasattr(tools, "tolist") else tools
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools):
        raise SFTDataError(f"{where}: the tools column must be a list of OpenAI function schemas")
    return list(tools) or None


def _render(tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool,
            tools: list[dict] | None = None) -> list[int]:
    kwargs = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True, **kwargs)
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


def multi_turn_example(tokenizer, messages: Any, where: str, tools: Any = None) -> SFTExample:
    """The whole chat; loss on every assistant turn (content, tool calls and end-of-turn tokens)."""
    messages = _as_messages(messages, where)
    tools = parse_tools(tools, where)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise SFTDataError(f"{where}: the chat has no assistant message, so there is nothing to learn")
    ids: list[int] = []
    mask: list[int] = []

    def extend(rendered: list[int], value: int, turn: int) -> None:
        if rendered[: len(ids)] != ids:
            raise SFTDataError(
                f"{where}: the chat template does not render message {turn} as an extension of the previous "
                "messages; multi-turn SFT needs a prefix-stable template (e.g. ChatML)"
            )
        new = rendered[len(ids):]
        ids.extend(new)
        mask.extend([value] * len(new))

    for i in turns:
        if i:
            extend(_render(tokenizer, messages[:i], True, tools), 0, i)  # up to the generation prompt
        extend(_render(tokenizer, messages[: i + 1], False, tools), 1, i)  # the assistant's turn
    if turns[-1] != len(messages) - 1:
        extend(_render(tokenizer, messages, False, tools), 0, len(messages) - 1)
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


__all__ = ["SFTDataError", "SFTExample", "collate_sft", "multi_turn_example", "parse_tools", "single_turn_example",
           "truncate_example"]
