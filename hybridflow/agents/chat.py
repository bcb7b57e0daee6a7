"""Chat-template rendering for agent loops: first prompts, continuations after a model turn, sanity check.

A multi-turn trajectory is built *incrementally*: the model's own tokens are kept exactly as sampled
(re-tokenising their text could give other ids, and the log-probs belong to the sampled ids), and after
each model turn the tokens the chat template puts between that turn and the next one are appended (the
tool results or user message, and the next generation prompt).

:func:`render_continuation` finds those tokens by rendering a fixed two-turn conversation with and
without the new messages: the tokens after the assistant turn's end-of-turn token (the EOS the engine
stops on) are what follows the model's own EOS in a full render.  :func:`check_tokenization` compares the
incremental ids with one render of the whole conversation (``multi_turn.tokenization_sanity_check_mode``).
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["render_prompt", "render_continuation", "check_tokenization", "SANITY_CHECK_MODES"]

SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")

_ANCHOR = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]


def _render_text(templater, messages, tools, add_generation_prompt: bool, **kwargs) -> str:
    extra = {"tools": tools} if tools else {}
    return templater.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                         **extra, **kwargs)


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _templater(tokenizer, processor):
    return processor if processor is not None and getattr(processor, "chat_template", None) else tokenizer


def system_prompt_ids(tokenizer, **kwargs) -> list[int]:
    """Tokens of the default system turn a template inserts before the first message ([] if none).

    Found in the render of a one-message conversation: the tokens before that message's header, up to
    and including the last end-of-turn (EOS) token and the newline after it.  A template without a
    default system turn has no EOS there, so the answer is empty.
    """
    rendered = _encode(tokenizer, _render_text(tokenizer, [{"role": "user", "content": "Q"}], None, False, **kwargs))
    marker = _encode(tokenizer, "Q")
    head = rendered[: max(0, _find_last(rendered, marker) - len(marker))]
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None or eos not in head:
        return []
    cut = len(head) - head[::-1].index(eos)
    newline = _encode(tokenizer, "\n")
    if head[cut : cut + len(newline)] == newline:
        cut += len(newline)
    return head[:cut]


def render_prompt(tokenizer, processor, messages: Sequence[dict[str, Any]], tools: list[dict] | None = None,
                  images: list | None = None, remove_system_prompt: bool = False, **kwargs) -> list[int]:
    """Ids of ``messages`` with the generation prompt, rendered as the dataset renders prompts (template
    text, then ``encode`` without special tokens), or by the processor when images are involved."""
    templater = _templater(tokenizer, processor)
    text = _render_text(templater, list(messages), tools, True, **kwargs)
    if processor is not None and images:
        ids = processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()
    else:
        ids = _encode(tokenizer, text)
    if remove_system_prompt:
        system = system_prompt_ids(tokenizer, **kwargs)
        if system and ids[: len(system)] == system:
            ids = ids[len(system) :]
    return ids


def render_continuation(tokenizer, new_messages: Sequence[dict[str, Any]], stop_ids: Sequence[int],
                        ended_with_stop: bool, processor=None, images: Sequence[Any] | None = None,
                        **kwargs) -> list[int]:
    """Tokens to append after a model turn so that the conversation continues with ``new_messages``
    (tool results, a user turn) and a fresh generation prompt.

    ``ended_with_stop``: the model's turn ended with one of ``stop_ids`` (its EOS); if it did not, the
    template's end-of-turn token is included (the model never sampled it, and it is masked out like
    every observation token).
    ``images``: the images of ``new_messages`` (a tool's ``ToolResponse.image``), in order; their placeholders
    are expanded to the processor's token counts (``agents/trajectory_images.py``).
    """
    templater = _templater(tokenizer, processor)
    before = _encode(tokenizer, _render_text(templater, _ANCHOR, None, False, **kwargs))
    after = _encode(tokenizer, _render_text(templater, _ANCHOR + list(new_messages), None, True, **kwargs))
    if after[: len(before)] != before:
        raise ValueError("the chat template renders an earlier turn differently once more messages follow it; "
                         "multi-turn rollouts need a template that only appends")
    stops = set(int(s) for s in stop_ids)
    answer_end = _find_last(before, _encode(tokenizer, "A"))
    end_of_turn = next((i for i in range(answer_end, len(before)) if before[i] in stops), None)
    if end_of_turn is None:  # the template closes turns without the EOS token: plain suffix
        ids = after[len(before) :]
    else:
        ids = after[end_of_turn + 1 if ended_with_stop else end_of_turn :]
    return _expand_images(processor, ids, images)


def _expand_images(processor, ids: list[int], images: Sequence[Any] | None) -> list[int]:
    if not images:
        return ids
    from hybridflow.agents.trajectory_images import expand_image_tokens, image_token_counts

    if processor is None or getattr(processor, "image_token_id", None) is None:
        raise ValueError(f"{len(images)} image(s) to show the model, but it has no multimodal processor (a text-only "
                         "model): use a vision-language checkpoint, or return text-only tool responses")
    return expand_image_tokens(ids, int(processor.image_token_id), image_token_counts(processor, images))


def _find_last(haystack: list[int], needle: list[int]) -> int:
    """Index just past the last occurrence of ``needle`` (0 when absent)."""
    for i in range(len(haystack) - len(needle), -1, -1):
        if haystack[i : i + len(needle)] == needle:
            return i + len(needle)
    return 0


def _assistant_closing(templater, tools, **kwargs) -> str:
    """The text a template writes after an assistant message's content (e.g. ``<|im_end|>``), stripped."""
    marker = "\u2063hybridflow-closing\u2063"
    text = _render_text(templater, [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}],
                        tools, False, **kwargs)
    return text[text.rfind(marker) + len(marker):].strip() if marker in text else ""


def check_tokenization(tokenizer, incremental_ids: Sequence[int], messages: Sequence[dict[str, Any]],
                       tools: list[dict] | None, mode: str, processor=None, images: Sequence[Any] | None = None,
                       **kwargs) -> str | None:
    """Compare the incrementally built ids with one render of the whole conversation.

    Returns ``None`` when they agree under ``mode``, else a short description of the first difference.
    ``strict``: the ids must be a prefix of the full render and what remains must be whitespace or the
    template's closing of an assistant turn (a last turn cut at the length budget has no end-of-turn token); ``ignore_strippable``: the decoded texts must agree once all
    whitespace is removed; ``disable``: no check. ``images``: the conversation's images (expanded as the
    processor expands them).
    """
    if mode == "disable":
        return None
    if mode not in SANITY_CHECK_MODES:
        raise ValueError(f"multi_turn.tokenization_sanity_check_mode={mode!r}; choose one of {SANITY_CHECK_MODES}")
    templater = _templater(tokenizer, processor)
    full = _expand_images(processor, _encode(tokenizer, _render_text(templater, list(messages), tools, False,
                                                                      **kwargs)), images)
    incremental = list(incremental_ids)
    if mode == "strict":
        n = len(incremental)
        rest = tokenizer.decode(full[n:]).strip()
        # what may follow the incremental ids: whitespace, or -- when the last turn was cut at the length
        # budget, without its end-of-turn token -- the template's closing of an assistant turn
        if full[:n] == incremental and rest in ("", _assistant_closing(templater, tools, **kwargs)):
            return None
        first = next((i for i, (a, b) in enumerate(zip(incremental, full)) if a != b), min(n, len(full)))
        return (f"token {first}: incremental {incremental[first:first + 5]} vs full render {full[first:first + 5]} "
                f"({n} vs {len(full)} tokens)")
    squeeze = lambda ids: "".join(tokenizer.decode(ids).split())  # noqa: E731
    if squeeze(incremental) == squeeze(full) or squeeze(full).startswith(squeeze(incremental)):
        return None
    return "decoded texts differ beyond whitespace"
