"""Reward managers: decode responses, score them, and place each score on the last valid response token.

verl's three rule-based managers, sharing one decoding/placement path:

* ``naive`` -- one ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`` call
  per sample (spread over the scoring pool);
* ``batch`` -- a single ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=, **kw)`` call
  returning one result per sample (for scorers that batch, e.g. an API judge); ``timeout_s`` covers the call;
* ``dapo`` -- ``naive`` plus DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): with
  ``L_exp = max_resp_len - buffer_len``, a response of length ``L`` gets
  ``min(-(L - L_exp) / buffer_len * penalty_factor, 0)`` added to its score.

Calling ``manager(data, return_dict=True)`` returns ``{"reward_tensor": (B, R) float32, "reward_extra_info":
dict[str, list] (one entry per sample; None where that sample's scorer failed), "reward_metrics":
dict[str, float], "reward_errors": list}`` where ``reward_metrics`` holds ``reward/error_count``,
``reward/timeout_count`` and ``reward/error_rate`` for this call (the trainer merges them into its step metrics)
and ``reward_errors`` says per sample why it could not be scored (``None`` when it was). Without ``return_dict``
only the tensor is returned. When the batch carries ``rm_scores`` (a reward-model worker ran), those are the
reward and no rule scorer is called, as in verl.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.rewards.custom_function import ScoreFnSpec
from hybridflow.rewards.outcome import ErrorTracker, ScoringConfig, as_score
from hybridflow.rewards.pool import OK, ScoringPool, TaskResult
from hybridflow.utils.registry import Registry

logger = logging.getLogger(__name__)

REWARD_MANAGERS: Registry[type] = Registry("reward manager")


@dataclass
class Decoded:
    """Per-sample inputs to a scorer, decoded from a generated batch."""

    solution_strs: list[str]
    prompt_strs: list[str]
    valid_lengths: list[int]
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict]


class RewardManager:
    """Shared machinery; subclasses implement :meth:`score_batch` (scores + extra info per sample)."""

    def __init__(
        self,
        tokenizer,
        num_examine: int = 0,
        compute_score: ScoreFnSpec | Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        reward_kwargs: dict[str, Any] | None = None,
        scoring: ScoringConfig | None = None,
        offered_kwargs: dict[str, Any] | None = None,
    ):
        self.tokenizer = tokenizer
        self.num_examine = num_examine
        self.reward_fn_key = reward_fn_key
        self.reward_kwargs = dict(reward_kwargs or {})
        spec = compute_score if isinstance(compute_score, ScoreFnSpec) else ScoreFnSpec(fn=compute_score)
        self.scoring = scoring or ScoringConfig()
        # keywords the run offers (a judge's client and address): passed only to a function that takes them
        self.offered = {k: v for k, v in (offered_kwargs or {}).items() if spec.accepts(k)}
        self.reward_kwargs.update(self.offered)
        spec.check_call(self.call_keywords(), self.expected_signature)  # a bad path / name / signature: now
        self.pool = ScoringPool(spec, self.scoring.num_workers, self.scoring.timeout_s,
                                memory_mb=self.scoring.worker_memory_mb)
        self.errors = ErrorTracker(self.scoring.error_score, judge=bool(offered_kwargs))

    expected_signature = "(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"

    def call_keywords(self) -> list[str]:
        """The keywords every scorer call passes (``_per_sample``): verl's four plus ``reward_kwargs``."""
        return self.keywords_for(self.reward_kwargs)

    @classmethod
    def keywords_for(cls, reward_kwargs) -> list[str]:
        return ["data_source", "solution_str", "ground_truth", "extra_info", *reward_kwargs]

    def close(self) -> None:
        """Stop the scoring worker processes (they are also stopped when the manager is collected)."""
        self.pool.close()

    # ------------------------------------------------------------------ public API
    def __call__(self, data: DataProto, return_dict: bool = False):
        if "rm_scores" in data.batch:
            out = {"reward_tensor": data.batch["rm_scores"], "reward_extra_info": {}, "reward_metrics": {},
                   "reward_errors": [None] * len(data)}
            return out if return_dict else out["reward_tensor"]
        self.errors.reset_step()
        decoded = self.decode(data)
        scores, extras = self.score_batch(decoded)
        responses = data.batch["responses"]
        reward_tensor = torch.zeros(responses.shape, dtype=torch.float32)
        positions = reward_positions(data.batch.get("response_mask"), decoded.valid_lengths)
        if scores:  # one scatter, not a tensor write per sample
            reward_tensor[torch.arange(len(scores)), torch.tensor(positions)] = torch.tensor(scores,
                                                                                             dtype=torch.float32)
        self._examine(decoded, scores)
        out = {
            "reward_tensor": reward_tensor,
            "reward_extra_info": _columns(extras),
            "reward_metrics": {**self.errors.metrics(len(scores)),
                               "reward/workers_recycled": float(self.pool.recycled)},
            "reward_errors": list(self.errors.sample_errors),
        }
        return out if return_dict else reward_tensor

    def score_batch(self, decoded: Decoded) -> tuple[list[float], list[dict[str, Any]]]:
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    def decode(self, data: DataProto) -> Decoded:
        """Decode valid prompt/response tokens (special tokens skipped) and gather scorer inputs."""
        responses = data.batch["responses"]
        prompts = data.batch["prompts"]
        p_len = prompts.shape[-1]
        if "attention_mask" in data.batch:  # counts tool-output tokens too, unlike response_mask
            resp_lengths = data.batch["attention_mask"][:, p_len:].sum(-1)
            prompt_lengths = data.batch["attention_mask"][:, :p_len].sum(-1)
        else:
            resp_lengths = data.batch["response_mask"].sum(-1)
            prompt_lengths = torch.full((len(responses),), p_len)
        nt = data.non_tensor_batch
        for key in (self.reward_fn_key, "reward_model"):
            if key not in nt:
                raise KeyError(
                    f"reward scoring needs the non-tensor column '{key}' (from the dataset rows); available: "
                    f"{sorted(nt)}. Check data.reward_fn_key and that the parquet has a 'reward_model' column."
                )
        out = Decoded([], [], [], [], [], [])
        # the lengths and columns once (a tensor index per sample and field cost a few us each)
        resp_lengths, prompt_lengths = resp_lengths.tolist(), prompt_lengths.tolist()
        sources, models = nt[self.reward_fn_key], nt["reward_model"]
        extras = nt["extra_info"] if "extra_info" in nt else None
        for i in range(len(responses)):
            n_resp, n_prompt = int(resp_lengths[i]), int(prompt_lengths[i])
            out.solution_strs.append(self.tokenizer.decode(responses[i, :n_resp].tolist(), skip_special_tokens=True))
            out.prompt_strs.append(
                self.tokenizer.decode(prompts[i, p_len - n_prompt :].tolist(), skip_special_tokens=True)
                if i < self.num_examine else ""
            )
            out.valid_lengths.append(n_resp)
            out.data_sources.append(str(sources[i]))
            out.ground_truths.append(_ground_truth(models[i]))
            extra = extras[i] if extras is not None else None
            out.extra_infos.append(_with_trajectory_info(dict(extra) if isinstance(extra, dict) else {}, nt, i))
        return out

    def _per_sample(self, decoded: Decoded) -> list[TaskResult]:
        tasks = [
            dict(data_source=ds, solution_str=s, ground_truth=gt, extra_info=ei, **self.reward_kwargs)
            for ds, s, gt, ei in zip(decoded.data_sources, decoded.solution_strs, decoded.ground_truths,
                                     decoded.extra_infos)
        ]
        return self.pool.run(tasks)

    def _examine(self, decoded: Decoded, scores: list[float]) -> None:
        for i in range(min(self.num_examine, len(scores))):
            logger.info("[prompt] %s\n[response] %s\n[ground_truth] %s\n[score] %s", decoded.prompt_strs[i],
                        decoded.solution_strs[i], decoded.ground_truths[i], scores[i])


def reward_positions(response_mask: torch.Tensor | None, valid_lengths: list[int]) -> list[int]:
    """Where each row's sequence-level reward sits: on its last *model* token (``response_mask`` 1), so that a
    multi-turn response ending in an observation still credits the model's last action (GAE carries values
    only across model tokens); on the last valid token when no mask is given or a row has no model token."""
    fallback = [max(int(n) - 1, 0) for n in valid_lengths]
    if response_mask is None:
        return fallback
    mask = response_mask.bool()
    last = (mask.shape[1] - 1 - torch.flip(mask, dims=[1]).long().argmax(dim=1)).tolist()
    has_model_token = mask.any(dim=1).tolist()
    return [last[i] if has_model_token[i] else fallback[i] for i in range(mask.shape[0])]


# What the agent loop learned about a trajectory, passed to scorers in ``extra_info`` as verl passes it.
_TRAJECTORY_COLUMNS = {"__num_turns__": "num_turns", "turn_scores": "turn_scores", "tool_rewards": "tool_rewards",
                       "reward_scores": "rollout_reward_scores"}


def _with_trajectory_info(extra_info: dict, non_tensors: dict, row: int) -> dict:
    """``extra_info`` plus the row's ``num_turns``, ``turn_scores`` (interaction scores), ``tool_rewards``
    (step rewards of its tool calls) and ``rollout_reward_scores`` when the rollout produced them."""
    for column, key in _TRAJECTORY_COLUMNS.items():
        if column in non_tensors and non_tensors[column][row] is not None:
            value = non_tensors[column][row]
            extra_info[key] = value.item() if isinstance(value, np.generic) else value
    return extra_info


def _ground_truth(reward_model: Any) -> Any:
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    raise ValueError(f"reward_model entry must be a dict with 'ground_truth', got {reward_model!r}")


def _columns(extras: list[dict[str, Any]]) -> dict[str, list]:
    keys = sorted({k for e in extras for k in e})
    return {k: [e.get(k) for e in extras] for k in keys}


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager(RewardManager):
    """One scorer call per sample (verl ``naive``)."""

    def score_batch(self, decoded):
        results = self._per_sample(decoded)
        pairs = [self.errors.resolve(r, decoded.data_sources[i]) for i, r in enumerate(results)]
        return [p[0] for p in pairs], [p[1] for p in pairs]


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(NaiveRewardManager):
    """verl ``prime``: one scorer call per sample, run in parallel worker processes with a per-sample
    timeout, a sample whose scorer fails or times out getting the error score instead of stopping the run.

    That is what every manager here does through the scoring pool (``reward_model.num_workers`` processes,
    ``reward_model.timeout_s`` per sample), so ``prime`` behaves as ``naive``; it is registered under
    verl's name so verl command lines with ``reward_model.reward_manager=prime`` run unchanged.
    """


@REWARD_MANAGERS.register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """verl 0.9's ``gdpo``: one scorer call per sample whose dict entries (``accuracy_reward``, ``format_reward``...)
    become the batch's columns, where ``algorithm.adv_estimator=gdpo`` reads the components named by
    ``algorithm.gdpo_reward_keys``.  Every manager here keeps a scorer's dict entries, so this is ``naive`` under
    verl's name."""


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    """One scorer call for the whole batch with list arguments (verl ``batch``)."""

    expected_signature = "(data_sources, solution_strs, ground_truths, extra_infos, **kwargs)"

    @classmethod
    def keywords_for(cls, reward_kwargs) -> list[str]:
        return ["data_sources", "solution_strs", "ground_truths", "extra_infos", *reward_kwargs]

    def score_batch(self, decoded):
        task = dict(data_sources=decoded.data_sources, solution_strs=decoded.solution_strs,
                    ground_truths=decoded.ground_truths, extra_infos=decoded.extra_infos, **self.reward_kwargs)
        (result,) = self.pool.run([task])
        n = len(decoded.solution_strs)
        if result.status == OK and (not isinstance(result.value, (list, tuple, np.ndarray)) or len(result.value) != n):
            got = type(result.value).__name__ if not hasattr(result.value, "__len__") else f"{len(result.value)} items"
            result = TaskResult("error", error=f"batch reward function must return a list of {n} scores, got {got}")
        if result.status != OK:
            pairs = [self.errors.resolve(result, "batch call") for _ in range(n)]
        else:
            pairs = [self.errors.resolve(TaskResult(OK, value), source)
                     for value, source in zip(result.value, decoded.data_sources)]
        return [p[0] for p in pairs], [p[1] for p in pairs]


@dataclass
class OverlongBufferConfig:
    """DAPO overlong buffer: ``len`` tokens before ``max_resp_len`` where the linear penalty ramps up."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """``naive`` + DAPO soft overlong punishment (Yu et al. 2025, §3.4, eq. 13)."""

    def __init__(self, tokenizer, num_examine: int = 0, compute_score=None, reward_fn_key: str = "data_source",
                 reward_kwargs: dict[str, Any] | None = None, scoring: ScoringConfig | None = None,
                 max_resp_len: int | None = None, overlong_buffer_cfg: OverlongBufferConfig | Any = None,
                 offered_kwargs: dict[str, Any] | None = None):
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, reward_kwargs, scoring, offered_kwargs)
        cfg = overlong_buffer_cfg if overlong_buffer_cfg is not None else OverlongBufferConfig()
        if isinstance(cfg, dict):
            cfg = OverlongBufferConfig(**cfg)
        self.overlong = cfg
        self.max_resp_len = max_resp_len
        if cfg.enable:
            if max_resp_len is None:
                raise ValueError("dapo reward manager: overlong_buffer_cfg.enable=true needs max_resp_len "
                                 "(set reward_model.reward_kwargs.max_resp_len to data.max_response_length)")
            if not 0 < cfg.len <= max_resp_len:
                raise ValueError(f"overlong_buffer_cfg.len must be in (0, max_resp_len={max_resp_len}], got {cfg.len}")

    def overlong_reward(self, length: int) -> float:
        expected = self.max_resp_len - self.overlong.len
        return min(-(length - expected) / self.overlong.len * self.overlong.penalty_factor, 0.0)

    def score_batch(self, decoded):
        eos = self.tokenizer.eos_token
        if eos:
            decoded.solution_strs = [s[: -len(eos)] if s.endswith(eos) else s for s in decoded.solution_strs]
        scores, extras = super().score_batch(decoded)
        if self.overlong.enable:
            for i, length in enumerate(decoded.valid_lengths):
                penalty = self.overlong_reward(length)
                scores[i] += penalty
                if self.overlong.log:
                    extras[i] = {**extras[i], "overlong_reward": penalty, "overlong": penalty < 0}
        return scores, extras


def compute_reward(data: DataProto, reward_fn: RewardManager) -> tuple[torch.Tensor, dict[str, list], dict[str, float]]:
    """Trainer-side reward stage: ``(token_level_scores, reward_extra_info, reward_metrics)``.

    With ``reward_model.enable`` the RM worker has already put ``rm_scores`` in the batch and the manager returns
    them unchanged; otherwise the rule scorer runs. Either way the trainer stores the tensor as
    ``token_level_scores`` and merges the metrics into its step metrics.
    """
    out = reward_fn(data, return_dict=True)
    return out["reward_tensor"], out["reward_extra_info"], out["reward_metrics"]


__all__ = ["REWARD_MANAGERS", "compute_reward", "RewardManager", "NaiveRewardManager", "PrimeRewardManager",
           "BatchRewardManager",
           "DAPORewardManager",
           "OverlongBufferConfig", "as_score"]
