"""``trainer.rollout_data_dir`` / ``trainer.validation_data_dir``: one JSONL file of generations per step.

verl users inspect what the policy actually wrote with these dumps (``<dir>/<step>.jsonl``, one object per
trajectory with ``input``, ``output``, ``score``, ``step`` and the reward extra info), so we keep the format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybridflow.protocol import DataProto


def _response_lengths(batch: DataProto) -> list[int]:
    """Tokens in each response, observations included: the response part of ``attention_mask`` (the count of
    ``response_mask`` would cut a multi-turn response short, since tool results are 0 there)."""
    if "attention_mask" not in batch.batch:
        return [int(n) for n in batch.batch["response_mask"].sum(-1).tolist()]
    width = batch.batch["responses"].shape[-1]
    return [int(n) for n in batch.batch["attention_mask"][:, -width:].sum(-1).tolist()]


def decode_batch(tokenizer, batch: DataProto) -> tuple[list[str], list[str]]:
    """Prompt and response texts of a generated batch (padding and special tokens removed); a multi-turn
    response includes its observations (tool results, user turns) as verl shows them."""
    inputs = tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True)
    lengths = _response_lengths(batch)
    outputs = [tokenizer.decode(r[:n], skip_special_tokens=True) for r, n in zip(batch.batch["responses"], lengths)]
    return inputs, outputs


def response_segments(tokenizer, batch: DataProto) -> list[list[tuple[str, int]]]:
    """Each response cut into runs of model tokens (``1``) and observation tokens (``0``: tool results, user
    turns) by ``response_mask``, decoded with special tokens kept (they show the turn structure)."""
    lengths = _response_lengths(batch)
    segments = []
    for ids, mask, n in zip(batch.batch["responses"].tolist(), batch.batch["response_mask"].tolist(), lengths):
        runs: list[tuple[str, int]] = []
        start = 0
        for i in range(1, n + 1):
            if i == n or mask[i] != mask[start]:
                runs.append((tokenizer.decode(ids[start:i], skip_special_tokens=False), int(mask[start])))
                start = i
        segments.append(runs)
    return segments


def dump_generations(directory: str, step: int, tokenizer, batch: DataProto, scores: list[float],
                     extra: dict[str, list[Any]] | None = None) -> Path:
    """Write ``<directory>/<step>.jsonl``; ``extra`` columns (same length as the batch) are added per row."""
    inputs, outputs = decode_batch(tokenizer, batch)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{step}.jsonl"
    extra = {k: v for k, v in (extra or {}).items() if len(v) == len(outputs)}
    with open(target, "w", encoding="utf-8") as f:
        for i, (inp, out) in enumerate(zip(inputs, outputs)):
            row = {"input": inp, "output": out, "score": float(scores[i]), "step": step}
            row.update({k: _plain(v[i]) for k, v in extra.items()})
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return target


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)


__all__ = ["decode_batch", "dump_generations", "response_segments"]
