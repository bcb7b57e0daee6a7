"""The RL prompt dataset: verl-format rows -> left-padded prompt tensors + the row's non-tensor fields.

Rows follow verl's schema (``data_source``, ``prompt`` chat messages, ``ability``, ``reward_model``
{``style``, ``ground_truth``}, ``extra_info`` with ``tools_kwargs`` / ``interaction_kwargs``, optional
``agent_name``), so users bring their verl parquet files unchanged. An item is the prompt batch contract of
``docs/architecture.md`` ("Batch keys"). Rows are validated when the dataset is built, so a wrong column
name or a malformed prompt fails before any model is loaded, with the file, row and fix in the message.
"""

from __future__ import annotations

import sys

from typing import Any

import torch

from hybridflow.data.io import DataFileError, as_file_list, read_rows
from hybridflow.data.multimodal import MultimodalDataError, as_media_list, check_alignment, load_image
from hybridflow.data.vision_prompts import VisionPrompts
from hybridflow.data.prompts import TRUNCATION_MODES, PromptTooLongError, check_chat_messages, left_pad, truncate
from hybridflow.data.row_limits import check_row_size
from hybridflow.utils.registry import closest

_REQUIRED_EXTRA = ("reward_model",)


class RLHFDataset(torch.utils.data.Dataset):
    """verl-compatible RL dataset over parquet / json / jsonl files (or hub names).

    ``config`` is the ``data`` config section read by attribute (``prompt_key``, ``reward_fn_key``,
    ``max_prompt_length``, ``truncation``, ``filter_overlong_prompts``, ``apply_chat_template_kwargs``).
    ``max_samples`` > 0 keeps only the first that many rows (``data.train_max_samples`` /
    ``val_max_samples``; see :func:`create_rl_dataset`). ``raw_prompt`` (the chat messages) is always
    returned, whatever ``data.return_raw_chat`` says: agent loops need it to re-template multi-turn
    conversations.

    With a multimodal ``processor`` (a vision-language checkpoint), rows may carry images in ``data.image_key``
    (videos in ``data.video_key``) placed by ``<image>`` markers in the prompt (``data/multimodal.py``). Prompts
    are then rendered and tokenized by the processor, so ``max_prompt_length`` counts the image tokens, and
    every item also holds ``multi_modal_data`` (``{"image": [PIL images]}``, for the rollout to re-process),
    ``multi_modal_inputs`` (the processor's ``pixel_values`` / ``image_grid_thw``..., when
    ``data.return_multi_modal_inputs``) and, for Qwen2-VL-family models, ``position_ids`` of shape
    (4, max_prompt_length) (``data/mrope.py``). ``raw_prompt`` then holds the chat content lists with the images.
    """

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        self.files = as_file_list(data_files, "data files")
        self.tokenizer = tokenizer
        self.processor = processor
        self.prompt_key = config.prompt_key
        self.reward_fn_key = config.reward_fn_key
        self.max_prompt_length = int(config.max_prompt_length)
        self.truncation = config.truncation
        self.template_kwargs = dict(config.apply_chat_template_kwargs or {})
        self.return_full_prompt = bool(config.return_full_prompt)
        self.image_key = config.image_key
        self.video_key = config.video_key
        self.return_multi_modal_inputs = bool(config.return_multi_modal_inputs)
        self.vision = VisionPrompts(processor, tokenizer) if processor is not None else None
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"data.truncation must be one of {', '.join(TRUNCATION_MODES)}, got '{self.truncation}'")
        if self.max_prompt_length <= 0:
            raise ValueError(f"data.max_prompt_length must be positive, got {self.max_prompt_length}")
        if tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no pad token; set one (e.g. tokenizer.pad_token = tokenizer.eos_token)")

        self.rows: list[dict[str, Any]] = []
        self.origins: list[tuple[str, int]] = []  # (file, row index in that file) for error messages
        max_row_bytes = int(config.max_row_bytes)
        for path in self.files:
            rows = read_rows(path)
            for i, row in enumerate(rows):  # before anything tokenizes them
                check_row_size(row, f"row {i} of '{path}'", max_row_bytes)
            self._check_columns(rows, path)
            self.rows.extend(rows)
            self.origins.extend((path, i) for i in range(len(rows)))
        if max_samples is not None and max_samples > 0:
            self.rows, self.origins = self.rows[:max_samples], self.origins[:max_samples]
        self.columns = list(dict.fromkeys(k for r in self.rows for k in r))
        for i, row in enumerate(self.rows):
            messages = check_chat_messages(row[self.prompt_key], self._where(i), self.prompt_key)
            if not isinstance(row["reward_model"], dict):
                raise DataFileError(f"{self._where(i)}: column 'reward_model' must be a dict with 'style' and "
                                 f"'ground_truth', got {type(row['reward_model']).__name__}")
            self._check_media(i, messages)
        self._ids_cache: dict[int, list[int]] = {}
        if config.filter_overlong_prompts:
            self._filter_overlong()
        elif self.truncation == "error" and self.vision is None:
            self._refuse_overlong()

    # ------------------------------------------------------------------ validation
    def _check_columns(self, rows: list[dict[str, Any]], path: str) -> None:
        if not rows:
            raise DataFileError(f"data file '{path}' contains no rows; check the preprocessing output")
        columns = list(dict.fromkeys(k for r in rows[:100] for k in r))
        for required in (self.prompt_key, self.reward_fn_key, *_REQUIRED_EXTRA):
            missing = [i for i, r in enumerate(rows) if required not in r]
            if missing:
                guess = closest(required, [c for c in columns if c != required])
                hint = f" Did you mean '{guess}'? Rename that column" if guess else " Add the column"
                names = {self.prompt_key: " (data.prompt_key)", self.reward_fn_key: " (data.reward_fn_key)"}
                field = names.get(required, "")
                raise DataFileError(
                    f"data file '{path}' has no column '{required}'{field} in {len(missing)} of {len(rows)} rows "
                    f"(first: row {missing[0]}). Columns found: {', '.join(columns)}.{hint}"
                    + (f" or set data.prompt_key='{guess}'." if required == self.prompt_key and guess else ".")
                )

    def _media(self, index: int) -> tuple[list, list]:
        row = self.rows[index]
        return as_media_list(row.get(self.image_key)), as_media_list(row.get(self.video_key))

    def _check_media(self, index: int, messages: list[dict[str, Any]]) -> None:
        """Images need a multimodal processor, and placeholders must pair up with them (decodable)."""
        images, videos = self._media(index)
        where = self._where(index)
        if (images or videos) and self.vision is None:
            raise MultimodalDataError(
                f"{where}: column '{self.image_key if images else self.video_key}' holds {len(images) or len(videos)} "
                f"{'image' if images else 'video'}(s), but the model has no multimodal processor (a text-only "
                "checkpoint): point actor_rollout_ref.model.path at a vision-language model (e.g. Qwen2.5-VL), or "
                f"remove the column (data.image_key={self.image_key!r} names the image column)"
            )
        if self.vision is None:
            return
        check_alignment(messages, len(images), len(videos), where, self.prompt_key, self.image_key, self.video_key)
        for k, image in enumerate(images):
            load_image(image, where, f"column '{self.image_key}' item {k}")

    def _where(self, index: int) -> str:
        path, local = self.origins[index]
        return f"row {local} of '{path}'"

    def _filter_overlong(self) -> None:
        keep = []
        for i in range(len(self.rows)):
            ids = self._tokenize(i)
            if len(ids) <= self.max_prompt_length:
                keep.append((i, ids))
        if not keep:
            raise DataFileError(
                f"data.filter_overlong_prompts removed all {len(self.rows)} rows of {self.files}: every prompt is "
                f"longer than data.max_prompt_length={self.max_prompt_length}; raise it"
            )
        dropped = len(self.rows) - len(keep)
        if dropped:
            print(f"hybridflow: data.filter_overlong_prompts dropped {dropped} of {len(self.rows)} rows of "
                  f"{self.files} (longer than data.max_prompt_length={self.max_prompt_length})", file=sys.stderr)
        self.rows = [self.rows[i] for i, _ in keep]
        self.origins = [self.origins[i] for i, _ in keep]
        self._ids_cache = {new: ids for new, (_, ids) in enumerate(keep)}

    def _refuse_overlong(self) -> None:
        """With truncation=error and no filter, an overlong prompt stops the run now, not when it is drawn (issue
        34: found after 8 steps). The ids are kept for the items."""
        for i in range(len(self.rows)):
            ids = self._tokenize(i)
            if len(ids) > self.max_prompt_length:
                raise PromptTooLongError(
                    f"{self._where(i)}: prompt is {len(ids)} tokens, longer than data.max_prompt_length="
                    f"{self.max_prompt_length} (data.truncation=error). Raise data.max_prompt_length, set "
                    "data.filter_overlong_prompts=true to drop such rows, or data.truncation=left|right|middle")
            self._ids_cache[i] = ids

    # ------------------------------------------------------------------ items
    def _render(self, index: int) -> str:
        """The prompt as text: the chat messages through the chat template, ready for generation."""
        messages = check_chat_messages(self.rows[index][self.prompt_key], self._where(index), self.prompt_key)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                  **self.template_kwargs)

    def _tokenize(self, index: int) -> list[int]:
        if index in self._ids_cache:
            return self._ids_cache[index]
        if self.vision is not None:
            return self._process(index)[1].input_ids
        return list(self.tokenizer.encode(self._render(index), add_special_tokens=False))

    def _process(self, index: int):
        """(chat content lists, processed prompt) of a row through the multimodal processor."""
        where = self._where(index)
        messages = check_chat_messages(self.rows[index][self.prompt_key], where, self.prompt_key)
        images, videos = self._media(index)
        images = [load_image(img, where, f"column '{self.image_key}' item {k}") for k, img in enumerate(images)]
        videos = [[load_image(f, where, f"column '{self.video_key}' item {k}") for f in as_media_list(v)]
                  for k, v in enumerate(videos)]
        return self.vision.process(messages, images, videos, self.template_kwargs, where)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        where = self._where(index)
        skip = {self.prompt_key, self.image_key, self.video_key} if self.vision is not None else {self.prompt_key}
        item: dict[str, Any] = {c: row.get(c) for c in self.columns if c not in skip}
        if self.vision is None:
            ids = truncate(self._tokenize(index), self.max_prompt_length, self.truncation, where)
            item.update(left_pad(ids, self.max_prompt_length, self.tokenizer.pad_token_id))
            item["raw_prompt"] = check_chat_messages(row[self.prompt_key], where, self.prompt_key)
        else:
            messages, prompt = self._process(index)
            ids = self.vision.truncate(prompt.input_ids, self.max_prompt_length, self.truncation, where)
            item.update(left_pad(ids, self.max_prompt_length, self.tokenizer.pad_token_id))
            item["position_ids"] = self.vision.position_ids(item["input_ids"], item["attention_mask"], prompt)
            item["raw_prompt"] = messages
            item["multi_modal_data"] = prompt.multi_modal_data
            if self.return_multi_modal_inputs:
                item["multi_modal_inputs"] = prompt.multi_modal_inputs
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        item["extra_info"] = extra
        item["raw_prompt_ids"] = ids
        item["index"] = extra["index"] if extra.get("index") is not None else index
        item["tools_kwargs"] = extra.get("tools_kwargs") or {}
        item["interaction_kwargs"] = extra.get("interaction_kwargs") or {}
        if self.return_full_prompt:  # verl's key: the templated prompt text, e.g. for reward functions
            item["full_prompts"] = self._render(index) if self.vision is None else self.tokenizer.decode(ids)
        return item


def create_rl_dataset(data_files, data_config, tokenizer, processor=None, is_train: bool = True):
    """The train or validation dataset, honouring ``data.train_max_samples`` / ``data.val_max_samples``.

    ``data.custom_cls.{path,name}`` replaces :class:`RLHFDataset` with a user class taking the same arguments.
    """
    from hybridflow.data.custom_classes import custom_dataset_class

    max_samples = data_config.train_max_samples if is_train else data_config.val_max_samples
    cls = custom_dataset_class(data_config) or RLHFDataset
    return cls(data_files, tokenizer, data_config, processor=processor, max_samples=max_samples)
