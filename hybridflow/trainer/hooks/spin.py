"""SPIN's step (verl-recipe's ``spin``): generate, score, pair, reference log-probs, DPO update.

Self-play fine-tuning (Chen et al. 2024, arXiv:2401.01335) trains the policy to prefer a target over its own
previous iterate's sample, with the DPO loss against that previous iterate as the reference.  The step reuses the
PPO step's stages -- generation and scoring (``ppo_step.collect``), the reference refresh
(``trainer.ref_update_freq``) and ``compute_ref_log_prob``, the weight push -- and its hook replaces the stages
between them: there is no old-log-prob pass, no advantage and no PPO update; the batch is turned into (chosen, rejected)
pairs and the actor takes the DPO update (``update_actor_dpo``, ``workers/dpo_actor.py``).

Pairs (``algorithm.dpo_pairs``):

* ``reward`` (verl-recipe): the two samples of a prompt (``rollout.n=2``), the one with the higher reward chosen.
  verl-recipe trains a tied pair with its first sample as chosen; here a tie carries no preference and trains
  nothing (``spin/tie_fraction`` counts them);
* ``reference`` (the paper): the dataset's answer (``algorithm.dpo_reference_field``, tokenised as the policy's
  response followed by EOS) is chosen over each of the prompt's samples.  Samples that equal the answer are
  skipped the same way.

Rows go out pair-ordered (chosen, rejected), padded with empty pairs to a multiple of twice the data-parallel size
so every rank receives whole pairs.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algorithms.preference import compute_onlinedpo_pref
from hybridflow.protocol import DataProto
from hybridflow.tracking.metrics import reduce_metrics
from hybridflow.trainer import stages
from hybridflow.trainer.hooks import StageHook
from hybridflow.trainer.ppo_step import refresh_reference_if_due
from hybridflow.trainer.step_log import StepLog
from hybridflow.workers.dpo_actor import DPO_SETTINGS, DpoSettings

__all__ = ["SpinHook", "reward_pairs", "reference_pairs", "pad_pairs"]


def reward_pairs(batch: DataProto) -> tuple[DataProto, float]:
    """The two samples of each prompt as (chosen, rejected) by ``token_level_scores``; tied pairs get an empty
    response mask.  Returns the pair batch and the tie fraction."""
    mask = batch.batch["response_mask"]
    scores = batch.batch["token_level_scores"]
    chosen = compute_onlinedpo_pref(scores, mask)
    rows = torch.arange(len(batch)).view(-1, 2)
    first_chosen = chosen.view(-1, 2)[:, 0]
    order = torch.where(first_chosen.unsqueeze(-1), rows, rows.flip(-1)).reshape(-1)
    pairs = batch.select_idxs(order)
    sums = (scores * mask).sum(-1).view(-1, 2)
    ties = sums[:, 0] == sums[:, 1]
    return _drop_pairs(pairs, ties), float(ties.float().mean())


def _drop_pairs(pairs: DataProto, drop: torch.Tensor) -> DataProto:
    if bool(drop.any()):
        mask = pairs.batch["response_mask"].clone().view(len(drop), 2, -1)
        mask[drop] = 0
        pairs.batch["response_mask"] = mask.view(len(pairs), -1)
    return pairs


def _answer_text(non_tensor: dict[str, Any], row: int, field: str) -> str:
    node, _, key = field.partition(".")
    entry = non_tensor.get(node)
    value = entry[row].get(key) if entry is not None and isinstance(entry[row], dict) else None
    if value is None:
        raise ValueError(f"algorithm.dpo_pairs=reference: row {row} has no {field} (the dataset's answer SPIN trains "
                         "towards); add it to the data or set algorithm.dpo_reference_field to where the answer is")
    return str(value)


def reference_pairs(batch: DataProto, tokenizer, field: str) -> tuple[DataProto, float]:
    """(the dataset's answer, the sample) for every generated row; a sample equal to the answer trains nothing.

    The answer is tokenised without special tokens, followed by EOS, and cut at the response length."""
    b = batch.batch
    if b["position_ids"].dim() != 2:
        raise ValueError("algorithm.dpo_pairs=reference builds answer rows for text models only (position_ids "
                         "(B, L)); use dpo_pairs=reward with a vision-language model")
    responses, mask = b["responses"], b["response_mask"]
    R = responses.shape[1]
    P = b["prompts"].shape[1]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers = torch.full_like(responses, pad_id)
    answer_mask = torch.zeros_like(mask)
    for i in range(len(batch)):
        ids = tokenizer.encode(_answer_text(batch.non_tensor_batch, i, field), add_special_tokens=False)
        if tokenizer.eos_token_id is not None:
            ids = ids + [tokenizer.eos_token_id]
        ids = ids[:R]
        answers[i, :len(ids)] = torch.tensor(ids, dtype=answers.dtype)
        answer_mask[i, :len(ids)] = 1
    answer_rows = batch.select_idxs(torch.arange(len(batch)))
    ab = answer_rows.batch
    ab["responses"] = answers
    ab["response_mask"] = answer_mask
    ab["input_ids"] = torch.cat([b["prompts"], answers], dim=1)
    ab["attention_mask"] = torch.cat([b["attention_mask"][:, :P], answer_mask.to(b["attention_mask"].dtype)], dim=1)
    ab["position_ids"] = (ab["attention_mask"].cumsum(-1) - 1).clamp(min=0).to(b["position_ids"].dtype)
    for key in ("rollout_log_probs", "old_log_probs", "token_level_scores", "rm_scores"):
        if key in ab:
            ab[key] = torch.zeros_like(ab[key])
    same = ((answers == responses) | ((answer_mask == 0) & (mask == 0))).all(dim=1)
    interleaved = DataProto.concat([answer_rows, batch])
    order = torch.stack([torch.arange(len(batch)), torch.arange(len(batch)) + len(batch)], dim=1).reshape(-1)
    pairs = interleaved.select_idxs(order)
    return _drop_pairs(pairs, same), float(same.float().mean())


def pad_pairs(pairs: DataProto, dp_size: int) -> DataProto:
    """Append empty pairs (copies of the first pair with no response token) up to a multiple of ``2 x dp_size``
    rows, so the data-parallel split hands every rank whole pairs."""
    rows = 2 * dp_size
    missing = (-len(pairs)) % rows
    if not missing:
        return pairs
    filler = pairs.select_idxs(torch.arange(missing) % 2)
    filler.batch["response_mask"] = torch.zeros_like(filler.batch["response_mask"])
    return DataProto.concat([pairs, filler])


class SpinHook(StageHook):
    """SPIN's update in place of PPO's stages between scoring and the weight push (see the module docstring)."""

    name = "spin"

    def __init__(self, config):
        self.config = config

    def train(self, run, batch: DataProto, log: StepLog) -> DataProto:
        cfg = self.config
        algo, actor = cfg.algorithm, cfg.actor_rollout_ref.actor
        with log.timed("pairs"):
            if algo.dpo_pairs == "reward":
                pairs, skipped = reward_pairs(batch)
                rows_per_prompt = 2
            else:
                pairs, skipped = reference_pairs(batch, run.tokenizer, algo.dpo_reference_field)
                rows_per_prompt = 2 * int(cfg.actor_rollout_ref.rollout.n)
        log.metrics["spin/tie_fraction"] = skipped
        pairs = pad_pairs(pairs, run.dp_size)
        pairs.meta_info.update(batch.meta_info)
        if not bool(pairs.batch["response_mask"].any()):
            log.metrics["spin/skipped_step"] = 1.0  # every pair tied: no preference to learn from
            return batch
        refresh_reference_if_due(run, log)
        with log.timed("ref"):
            stages.compute_ref_log_prob(run.groups, pairs)
        pairs.meta_info[DPO_SETTINGS] = DpoSettings(beta=float(actor.dpo_beta), loss_type=algo.dpo_loss_type,
                                                    label_smoothing=float(algo.dpo_label_smoothing),
                                                    rows_per_prompt=rows_per_prompt)
        pairs.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
        with log.timed("update_actor"):
            out = run.groups.actor_rollout.update_actor_dpo(pairs)
            log.update(reduce_metrics(out.meta_info.get("metrics", {})))
        run.weights.after_update(run, log)
        return batch

    def before_step_metrics(self, batch: DataProto, log: StepLog) -> None:
        """verl's step metrics of the scored samples; SPIN computes no advantage (zeros stand in for them)."""
        b = batch.batch
        b["token_level_rewards"] = b["token_level_scores"]
        b["advantages"] = b["returns"] = torch.zeros_like(b["token_level_scores"])

    def after_step_metrics(self, metrics: dict[str, float]) -> None:
        for key in [k for k in metrics if k.startswith(("critic/advantages/", "critic/returns/"))]:
            del metrics[key]
