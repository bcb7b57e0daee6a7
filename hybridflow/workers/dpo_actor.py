"""SPIN's policy update: the DPO loss over (chosen, rejected) pairs, on the actor's engine.

The batch arrives pair-ordered -- rows 2k (chosen) and 2k+1 (rejected) form pair k -- with the reference's
``ref_log_prob``; a pair whose two rows have no response token (padding, tied rewards) trains nothing.  Pairs are
never split: mini-batches and micro-batches hold whole pairs, a token budget (``use_dynamic_bsz``) is filled with
pairs, and the controller hands every data-parallel rank whole pairs.  Each micro-batch's loss is its pairs' DPO
losses divided by the number of pairs of the whole mini-batch (all ranks), times the rank count (the gradient
reduction averages over ranks), so the update does not depend on the split, as for the PPO losses
(``algorithms/aggregation.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algorithms.preference import compute_online_dpo_loss, sequence_log_probs
from hybridflow.engine.forward import response_log_probs
from hybridflow.engine.micro_batch import balanced_partitions, num_micro_batches_for_budget
from hybridflow.protocol import DataProto

__all__ = ["DPO_SETTINGS", "DpoSettings", "update_policy_dpo"]

# meta_info key of the batch sent to ``update_actor_dpo``
DPO_SETTINGS = "dpo_settings"
_KEYS = ("responses", "input_ids", "attention_mask", "position_ids", "response_mask", "ref_log_prob")


@dataclass(frozen=True)
class DpoSettings:
    beta: float
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    rows_per_prompt: int = 2  # rows of the pair batch per prompt of ppo_mini_batch_size (2 x pairs per prompt)


def _pair_micro_batches(mini: DataProto, actor: Any) -> list[DataProto]:
    """Micro-batches of whole pairs: a fixed even row count, or pairs packed under the token budget."""
    cfg = actor.config
    pairs = len(mini) // 2
    if cfg.use_dynamic_bsz:
        lengths = mini.batch["attention_mask"].sum(-1).view(-1, 2).sum(-1).tolist()
        budget = int(cfg.ppo_max_token_len_per_gpu) * int(actor.engine.parallel_dims.sp)
        k = num_micro_batches_for_budget(lengths, budget)
        bins = balanced_partitions(lengths, k)
        return [mini.select_idxs([r for p in sorted(b) for r in (2 * p, 2 * p + 1)]) for b in bins]
    size = max(2, int(cfg.ppo_micro_batch_size_per_gpu) // 2 * 2)
    return [mini.slice(start, min(start + size, 2 * pairs)) for start in range(0, 2 * pairs, size)]


def _pair_counts(mask: torch.Tensor) -> torch.Tensor:
    """(P,) bool: pairs with a response token in both rows (the others are padding or skipped ties)."""
    has = mask.bool().any(dim=-1).view(-1, 2)
    return has[:, 0] & has[:, 1]


def update_policy_dpo(actor: Any, data: DataProto) -> dict[str, list[float]]:
    """One pass of DPO updates over ``data`` (``actor`` is the rank's ``PPOActor``); verl-named metrics.

    Runs ``actor.ppo_epochs`` epochs over mini-batches of ``ppo_mini_batch_size`` prompts' pairs."""
    cfg, engine = actor.config, actor.engine
    settings: DpoSettings = data.meta_info[DPO_SETTINGS]
    temperature = float(data.meta_info["temperature"])
    if len(data) % 2:
        raise ValueError(f"the DPO batch of this rank has {len(data)} rows: pairs must not be split over ranks")
    total = int(cfg.ppo_mini_batch_size) * int(settings.rows_per_prompt)
    if total % (2 * engine.dp_size):
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={cfg.ppo_mini_batch_size} prompts give {total // 2} DPO pairs "
            f"per mini-batch, which cannot be shared by {engine.dp_size} data-parallel ranks as whole pairs; choose a "
            f"mini-batch whose pair count is a multiple of {engine.dp_size}")
    mini_rows = total // engine.dp_size
    batch = data.select(batch_keys=[k for k in _KEYS if k in data.batch])
    metrics: dict[str, list[float]] = defaultdict(list)
    engine.module.train()
    with engine.on_device(with_optimizer=True):
        for epoch in range(int(cfg.ppo_epochs)):
            batch_e = batch
            if cfg.shuffle:  # shuffle pairs, keep each pair's two rows together
                gen = torch.Generator().manual_seed(int(cfg.data_loader_seed) * 1009 + epoch)
                order = torch.randperm(len(batch) // 2, generator=gen)
                batch_e = batch.select_idxs(torch.stack([2 * order, 2 * order + 1], dim=1).reshape(-1))
            for mini in batch_e.split(mini_rows):
                _train_pairs(actor, mini, temperature, settings, metrics)
    metrics["actor/lr"].append(engine.lr_scheduler_step())
    return dict(metrics)


def _train_pairs(actor: Any, mini: DataProto, temperature: float, settings: DpoSettings,
                 metrics: dict[str, list[float]]) -> None:
    cfg, engine = actor.config, actor.engine
    micro_batches = _pair_micro_batches(mini, actor)
    local_pairs = sum(int(_pair_counts(mb.batch["response_mask"]).sum()) for mb in micro_batches)
    (global_pairs,) = engine.all_reduce_sum([float(local_pairs)])
    denominator = max(global_pairs, 1.0)
    sums: dict[str, float] = defaultdict(float)
    engine.zero_grad()
    for mb in micro_batches:
        b = mb.batch.to(engine.device)
        mask = b["response_mask"]
        with engine.autocast(), engine.activation_offload():
            log_prob, _ = response_log_probs(
                engine.module, b, temperature, False, actor.use_remove_padding, packed=actor.packed,
                use_torch_compile=bool(cfg.use_torch_compile), sequence_parallel=engine.sequence_parallel,
            )
        seq = sequence_log_probs(log_prob, mask).view(-1, 2)
        ref = sequence_log_probs(b["ref_log_prob"], mask).view(-1, 2)
        losses, logits = compute_online_dpo_loss(seq[:, 0], seq[:, 1], ref[:, 0], ref[:, 1], settings.beta,
                                                 settings.label_smoothing, settings.loss_type)
        valid = _pair_counts(mask).to(losses.dtype)
        loss = (losses * valid).sum() / denominator * engine.dp_size
        loss.backward()
        with torch.no_grad():
            sums["actor/dpo_loss"] += float(loss.detach()) / engine.dp_size
            sums["actor/dpo_logits"] += float((logits * valid).sum()) / denominator
            sums["actor/dpo_acc"] += float(((logits > 0).to(valid.dtype) * valid).sum()) / denominator
            chosen_reward = settings.beta * (seq[:, 0] - ref[:, 0])
            rejected_reward = settings.beta * (seq[:, 1] - ref[:, 1])
            sums["actor/rewards_chosen"] += float((chosen_reward * valid).sum()) / denominator
            sums["actor/rewards_rejected"] += float((rejected_reward * valid).sum()) / denominator
    step = engine.optimizer_step(cfg.grad_clip)
    actor._track_skips(step.stepped, step.grad_norm)
    totals = engine.all_reduce_sum([sums[k] for k in sorted(sums)])
    for key, value in zip(sorted(sums), totals):
        metrics[key].append(value)
    metrics["actor/pg_loss"].append(metrics["actor/dpo_loss"][-1])
    metrics["actor/dpo_pairs"].append(global_pairs)
    metrics["actor/grad_norm"].append(step.grad_norm)
    metrics["actor/nonfinite_grad_skipped"].append(0.0 if step.stepped else 1.0)
