"""PRIME's stages (verl-recipe's ``prime``): over-sampled prompts filtered by accuracy, the implicit PRM's own
update step, and PRIME's advantage -- on the PPO step, which stays as it is otherwise.

* ``after_scoring``: the loader hands ``data.oversample_factor`` times the batch (``data.gen_batch_size`` is
  set to it at config time); after generation and rule scoring, each sample's outcome label ``acc`` (the scorer's
  ``acc`` when it returns one, else its score, clipped to [0, 1]) is written to the batch, and the prompts whose
  mean accuracy lies within ``data.accuracy_lower_bound..upper_bound`` (``filter_accuracy``) and whose samples
  were not cut at the response length (``filter_truncate``) go first; the first ``data.train_batch_size`` prompts
  train.
* ``before_advantage``: the PRM (``workers/prime_rm.py``) trains on the labels and scores the batch --
  ``reward_model.model.update``: ``before`` (train, then score with the updated PRM), ``after`` (the update's own
  forward passes score) or ``none`` (score only) -- and its process rewards are normalised over the whole batch
  (``reward_model.prime_norm``).
* the advantage is ``prime`` (``algorithms/prime.py``): RLOO of the process rewards and of the outcome labels,
  combined with ``algorithm.reward_dpo_coef`` / ``reward_gt_coef`` (verl-recipe writes ``adv_estimator=rloo`` for
  it).  The PRM is saved in checkpoints (``reward_model``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.algorithms.prime import compute_dpo_accuracy, prime_norm
from hybridflow.protocol import DataProto
from hybridflow.tracking.metrics import reduce_metrics
from hybridflow.trainer.hooks import StageHook
from hybridflow.trainer.step_log import StepLog

__all__ = ["PrimeHook", "outcome_labels", "filter_and_downsample"]


def outcome_labels(batch: DataProto) -> torch.Tensor:
    """(B,) labels in [0, 1]: the scorer's ``acc`` column when it has one, else the sequence score."""
    column = batch.non_tensor_batch.get("acc")
    if column is not None and all(isinstance(v, (bool, int, float, np.number)) for v in column):
        labels = torch.tensor([float(v) for v in column], dtype=torch.float32)
    else:
        labels = batch.batch["token_level_scores"].sum(-1).float()
    return labels.clamp(0.0, 1.0)


def filter_and_downsample(batch: DataProto, n: int, keep_prompts: int, data_cfg: Any,
                          max_response_length: int) -> tuple[DataProto, dict[str, float]]:
    """Prompts passing the accuracy / truncation filters first, then the first ``keep_prompts`` of them.

    Rows are the ``n`` samples of each prompt side by side (the rollout's order)."""
    acc = batch.batch["acc"].view(-1, n)
    passed = torch.ones(acc.shape[0], dtype=torch.bool)
    if data_cfg.filter_accuracy:
        mean = acc.mean(-1)
        passed &= (mean >= data_cfg.accuracy_lower_bound) & (mean <= data_cfg.accuracy_upper_bound)
    if data_cfg.filter_truncate:
        lengths = batch.batch["response_mask"].sum(-1).view(-1, n).max(-1).values
        passed &= lengths < max_response_length - 1
    order = torch.argsort((~passed).to(torch.int8), stable=True)[:keep_prompts]
    rows = (order.unsqueeze(-1) * n + torch.arange(n)).reshape(-1)
    metrics = {"prime/filter_pass_fraction": float(passed.float().mean()), "acc": float(acc.mean()),
               "prime/kept_pass_fraction": float(passed[order].float().mean())}
    return batch.select_idxs(rows), metrics


class PrimeHook(StageHook):
    """PRIME's stages on the PPO step (see the module docstring)."""

    name = "prime"
    advantage_estimator = "prime"

    def __init__(self, config):
        self.config = config

    def after_scoring(self, run, batch: DataProto, log: StepLog) -> DataProto:
        cfg = self.config
        batch.batch["acc"] = outcome_labels(batch)
        with log.timed("filter"):
            batch, filter_metrics = filter_and_downsample(batch, run.plan.n, int(cfg.data.train_batch_size),
                                                          cfg.data, int(cfg.data.max_response_length))
        log.update(filter_metrics)
        return batch

    def before_advantage(self, run, batch: DataProto, log: StepLog) -> None:
        cfg = self.config
        rm = run.groups.reward_model
        batch.meta_info["rollout_n"] = run.plan.n
        update = cfg.reward_model.model.update
        with log.timed("update_reward_model" if update != "none" else "reward_model"):
            if update == "none":
                out = rm.compute_rm_score(batch)
            else:
                out = rm.update_rm(batch)
                log.update(reduce_metrics(out.meta_info.get("metrics", {})))
                if update == "before":
                    out = rm.compute_rm_score(batch)
        process = prime_norm(out.batch["process_rewards"].float(), cfg.reward_model.prime_norm)
        batch.batch["process_rewards"] = process
        mask = batch.batch["response_mask"]
        log.metrics["reward_model/reward"] = float((process * mask).sum(-1).mean())
        log.metrics["reward_model/raw_reward"] = float((out.batch["prm_q"] * mask).sum(-1).mean())
        log.metrics["reward_model/dpo_acc"] = float(compute_dpo_accuracy(process, batch.batch["acc"], mask,
                                                                         batch.non_tensor_batch["uid"]))

    def trained_roles(self, groups) -> dict[str, object]:
        return {"reward_model": groups.reward_model}
