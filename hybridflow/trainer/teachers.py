"""On-policy distillation's teachers: their worker groups and the routing of rows to them (``distillation.*``).

Each teacher of ``distillation.teacher_models`` is a worker group of its own running the reference-policy role of
``ActorRolloutRefWorker`` on the teacher's checkpoint (``model_path``: any Hugging Face folder or hub name whose
tokenizer maps the student's token ids to the same tokens -- checked at start).  Its one job is
``compute_ref_log_prob``: the teacher's log-probs of the tokens the student sampled, at the rollout temperature
(``inference.temperature``), which the actor turns into the per-token distillation term
(``algorithms/distillation.py``); with ``loss_mode=forward_kl_topk`` also its ``topk`` most likely tokens at every
response position (ids and log-probs, ``workers/teacher_topk.py``).

Placement: with ``distillation.nnodes=0`` the teachers are roles of the colocated host, in the actor's own
processes (one per device, run one after another like the reference); otherwise each teacher gets a pool of its
own, ``num_replicas x tensor_model_parallel_size x data_parallel_size`` processes of the
``distillation.nnodes x n_gpus_per_node`` teacher pool (one in this process with ``trainer.backend=local``).

Routing (``distillation.teacher_key``, default ``data_source``): one teacher serves every row; several serve the
rows whose ``teacher_key`` column equals their ``key``, and a row no teacher serves stops the step naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algorithms.distillation import TEACHER_LOG_PROBS, TEACHER_TOPK, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS
from hybridflow.config.checks.distillation import TeacherEntry
from hybridflow.protocol import DataProto

__all__ = ["Teacher", "TeacherRouter"]


@dataclass
class Teacher:
    entry: TeacherEntry
    group: Any  # worker group (or colocated view) of the teacher's reference-role workers


class TeacherRouter:
    """Sends each row to its teacher and gathers ``teacher_log_probs`` (B, R) in the batch's row order."""

    def __init__(self, teachers: list[Teacher], teacher_key: str):
        if not teachers:
            raise ValueError("distillation.enabled=true but no teacher worker group was started")
        self.teachers = teachers
        self.teacher_key = teacher_key

    def init_models(self) -> None:
        for t in self.teachers:
            t.group.init_model()

    def _rows(self, batch: DataProto) -> dict[int, torch.Tensor]:
        """Teacher index -> row indices it serves."""
        if len(self.teachers) == 1:
            return {0: torch.arange(len(batch))}
        column = batch.non_tensor_batch.get(self.teacher_key)
        if column is None:
            raise KeyError(f"distillation.teacher_key={self.teacher_key!r}: the batch has no such column to route rows "
                           f"to teachers by (columns: {sorted(batch.non_tensor_batch)})")
        by_key = {t.entry.key: i for i, t in enumerate(self.teachers)}
        unknown = sorted({str(v) for v in column if str(v) not in by_key})
        if unknown:
            raise ValueError(f"no teacher serves {self.teacher_key}={unknown[0]!r} (rows with {unknown}); teachers: "
                             f"{sorted(by_key)} -- add a distillation.teacher_models entry with that key")
        rows: dict[int, list[int]] = {}
        for row, value in enumerate(column):
            rows.setdefault(by_key[str(value)], []).append(row)
        return {i: torch.tensor(r) for i, r in rows.items()}

    def log_probs(self, batch: DataProto) -> dict[str, float]:
        """Put ``teacher_log_probs`` into ``batch``; returns the rows each teacher scored."""
        out = torch.zeros(batch.batch["responses"].shape, dtype=torch.float32)
        k = int(batch.meta_info.get(TEACHER_TOPK) or 0)  # forward_kl_topk: the teachers' top-k tokens too
        topk = (torch.zeros(*out.shape, k), torch.zeros(*out.shape, k, dtype=torch.long)) if k else None
        counts = {}
        for index, rows in self._rows(batch).items():
            teacher = self.teachers[index]
            part = batch.select_idxs(rows)
            part.meta_info["temperature"] = teacher.entry.temperature
            scored = teacher.group.compute_ref_log_prob(part)
            out[rows] = scored.batch["ref_log_prob"].float()
            if topk is not None:
                topk[0][rows] = scored.batch["ref_topk_log_probs"].float()
                topk[1][rows] = scored.batch["ref_topk_ids"].long()
            counts[f"distillation/rows/{teacher.entry.key}"] = float(len(rows))
        batch.batch[TEACHER_LOG_PROBS] = out
        if topk is not None:
            batch.batch[TEACHER_TOPK_LOG_PROBS], batch.batch[TEACHER_TOPK_IDS] = topk
        return counts
