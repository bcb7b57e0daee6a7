"""DAPO dynamic sampling: keep only prompt groups whose samples disagree, refill until the batch is full.

DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", §3.2): with a
group-relative advantage, a group whose n rewards are all equal (all right or all wrong) has zero advantage
and contributes no gradient, only noise in the token-mean denominator.  Such groups are dropped and new
prompt batches are generated until ``data.train_batch_size`` prompts with signal are collected.
``algorithm.filter_groups.max_num_gen_batches`` bounds the number of generation rounds (<= 0: unbounded) so a
task that is already solved (or hopeless) fails loudly instead of looping forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hybridflow.protocol import DataProto

SEQUENCE_METRICS = ("seq_reward", "seq_final_reward")


def group_metric_values(batch: DataProto, metric: str) -> np.ndarray:
    """Per-trajectory values of ``metric``.

    ``seq_reward`` = sum of ``token_level_scores``; ``seq_final_reward`` = sum of ``token_level_rewards``
    (after a KL penalty); any other name (``acc``, ``score``, ...) is read from the reward manager's extra
    info, which the reward stage stores as a non-tensor column.
    """
    if metric == "seq_reward":
        return batch.batch["token_level_scores"].sum(-1).float().numpy()
    if metric == "seq_final_reward":
        return batch.batch["token_level_rewards"].sum(-1).float().numpy()
    if metric not in batch.non_tensor_batch:
        available = sorted(set(batch.non_tensor_batch) - {"uid", "raw_prompt", "raw_prompt_ids"})
        raise KeyError(
            f"algorithm.filter_groups.metric={metric!r} is not produced by the reward function; "
            f"use seq_reward, seq_final_reward or one of the reward extra-info keys {available}"
        )
    return np.asarray([float(v) for v in batch.non_tensor_batch[metric]], dtype=np.float64)


def informative_group_mask(batch: DataProto, metric: str) -> np.ndarray:
    """Boolean row mask: True for rows whose ``uid`` group has non-zero std of ``metric`` (or one sample).

    A singleton group is kept (as in the DAPO recipe): with one sample there is nothing to compare, and
    dropping it would silently discard every prompt when ``rollout.n == 1``.
    """
    values = group_metric_values(batch, metric)
    uids = batch.non_tensor_batch["uid"]
    by_uid: dict[object, list[float]] = {}
    for uid, v in zip(uids, values):
        by_uid.setdefault(uid, []).append(v)
    keep_uid = {uid: (len(vs) == 1 or float(np.std(vs)) > 0.0) for uid, vs in by_uid.items()}
    return np.asarray([keep_uid[u] for u in uids], dtype=bool)


@dataclass
class GroupFilterAccumulator:
    """Collects informative groups across generation rounds until ``target_prompts`` groups are held."""

    target_prompts: int
    n: int
    metric: str
    max_num_gen_batches: int
    parts: list[DataProto] = field(default_factory=list)
    num_gen_batches: int = 0
    num_prompts: int = 0
    kept_groups: int = 0
    seen_groups: int = 0

    def add(self, batch: DataProto) -> None:
        """Filter one scored generation batch and keep its informative groups."""
        self.num_gen_batches += 1
        mask = informative_group_mask(batch, self.metric)
        groups = len(set(batch.non_tensor_batch["uid"]))
        kept = batch.select_idxs(mask)
        kept_groups = len(set(kept.non_tensor_batch["uid"])) if len(kept) else 0
        self.seen_groups += groups
        self.kept_groups += kept_groups
        self.num_prompts += kept_groups
        if len(kept):
            self.parts.append(kept)

    @property
    def full(self) -> bool:
        return self.num_prompts >= self.target_prompts

    def check_budget(self) -> None:
        """Raise when another generation round would exceed ``max_num_gen_batches``."""
        if 0 < self.max_num_gen_batches <= self.num_gen_batches:
            raise RuntimeError(
                f"DAPO dynamic sampling collected only {self.num_prompts}/{self.target_prompts} prompt groups "
                f"with non-zero '{self.metric}' variance after {self.num_gen_batches} generation batches "
                f"(algorithm.filter_groups.max_num_gen_batches={self.max_num_gen_batches}). The task is "
                "too easy or too hard for the current policy: raise max_num_gen_batches (<=0 = unlimited), "
                "raise data.gen_batch_size or rollout.n, or disable algorithm.filter_groups.enable."
            )

    def take(self) -> DataProto:
        """The first ``target_prompts`` groups (``target_prompts * n`` rows), as the DAPO recipe truncates."""
        batch = DataProto.concat(self.parts)
        batch.meta_info.pop("metrics", None)
        return batch.slice(0, self.target_prompts * self.n)

    def metrics(self) -> dict[str, float]:
        return {
            "train/num_gen_batches": float(self.num_gen_batches),
            "train/filter_groups_kept_ratio": self.kept_groups / max(self.seen_groups, 1),
            # every generated group counts, before filtering: the share the filter had to throw away
            "train/zero_variance_group_fraction": 1.0 - self.kept_groups / max(self.seen_groups, 1),
        }


def zero_variance_fraction(batch: DataProto, metric: str) -> float:
    """Share of prompt groups without signal (logged for every run, filtering on or off)."""
    mask = informative_group_mask(batch, metric)
    uids = batch.non_tensor_batch["uid"]
    groups = {u: m for u, m in zip(uids, mask)}
    return float(np.mean([not m for m in groups.values()])) if groups else 0.0


__all__ = [
    "GroupFilterAccumulator",
    "group_metric_values",
    "informative_group_mask",
    "zero_variance_fraction",
]
