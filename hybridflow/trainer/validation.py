"""Validation: generate on the held-out set with ``rollout.val_kwargs``, score, aggregate per data source.

Runs before training (``trainer.val_before_train``), every ``trainer.test_freq`` steps and after the last
step.  Each prompt is answered ``val_kwargs.n`` times; per data source we report verl's
``val-core/<source>/<acc|reward>/mean@N`` (plus ``best@N`` (unbiased, exact) / ``maj@N`` (bootstrap), see
``hybridflow.tracking.validation_metrics``).  ``trainer.log_val_generations`` samples (input, output, score; for multi-turn rows also the response cut
into model and observation ``segments``) are returned for the logger and the run report.  Agent-loop rows add
verl's ``val-aux/num_turns/{min,max,mean}`` and the tool use of the held-out answers:
``val-aux/agent/tool_calls_per_trajectory/mean`` and ``val-aux/agent/tool_call_rate`` (the fraction of
trajectories with at least one tool call, malformed calls included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from hybridflow.rewards.scorers.answer_variants import answer_variants
from hybridflow.tracking.validation_metrics import process_validation_metrics
from hybridflow.trainer.rollout_dump import decode_batch, dump_generations, response_segments
from hybridflow.trainer.stages import WorkerGroups, generate, prompts_from_loader


@dataclass
class ValidationResult:
    metrics: dict[str, float]
    samples: list[dict[str, Any]]


class Validator:
    """Validation over a fixed loader; stateless between calls so it never disturbs training RNG streams."""

    def __init__(self, groups: WorkerGroups, dataloader: Iterable, reward_fn: Callable, tokenizer, val_kwargs,
                 num_log_samples: int, seed: int, dump_dir: str | None = None):
        self.groups = groups
        self.dataloader = dataloader
        self.reward_fn = reward_fn
        self.tokenizer = tokenizer
        self.val_kwargs = val_kwargs
        self.num_log_samples = num_log_samples
        self.seed = seed
        self.dump_dir = dump_dir

    def generation_meta(self) -> dict[str, Any]:
        vk = self.val_kwargs
        return {"validate": True, "do_sample": bool(vk.do_sample), "temperature": vk.temperature,
                "top_p": vk.top_p, "top_k": vk.top_k, "recompute_log_prob": False}

    def run(self, global_step: int) -> ValidationResult:
        sources: list[str] = []
        inputs: list[str] = []
        groups: list[str] = []  # what makes two samples answers to the same prompt
        outputs: list[str] = []
        infos: dict[str, list[Any]] = {"reward": []}
        extra_cols: dict[str, list[Any]] = {}
        turns: list[int] = []
        tool_calls: list[float] = []
        segments: list[list[tuple[str, int]]] = []
        variants: dict[str, list[Any]] = {}  # strict / lenient math accuracies, named by answer extractor
        for batch_dict in self.dataloader:
            prompts = prompts_from_loader(batch_dict)
            batch = generate(self.groups, prompts, meta=self.generation_meta())
            result = self.reward_fn(batch, return_dict=True)
            scores = result["reward_tensor"].sum(-1).tolist()
            infos["reward"].extend(scores)
            for key, values in result.get("reward_extra_info", {}).items():
                if len(values) == len(batch):
                    extra_cols.setdefault(key, []).extend(values)
            sources.extend(str(s) for s in batch.non_tensor_batch["data_source"])
            texts_in, texts_out = decode_batch(self.tokenizer, batch)
            add_answer_variants(variants, len(outputs), batch, texts_out)
            inputs.extend(texts_in)
            if "multi_modal_data" in batch.non_tensor_batch:  # one question, many pictures: group by row
                texts_in = [f"{t}\x00{u}" for t, u in zip(texts_in, batch.non_tensor_batch["uid"])]
            groups.extend(texts_in)
            outputs.extend(texts_out)
            segments.extend(response_segments(self.tokenizer, batch))
            nt = batch.non_tensor_batch
            if "__num_turns__" in nt:
                turns.extend(int(t) for t in nt["__num_turns__"])
            if "tool_call_count" in nt:
                tool_calls.extend(float(c) for c in nt["tool_call_count"] if c is not None)
            if self.dump_dir:
                dump_generations(self.dump_dir, global_step, self.tokenizer, batch, scores,
                                 result.get("reward_extra_info"))
        for key, values in {**extra_cols, **variants}.items():
            values = values + [None] * (len(infos["reward"]) - len(values))
            if len(values) == len(infos["reward"]) and key not in infos:
                infos[key] = values
        metrics = process_validation_metrics(sources, groups, infos, seed=self.seed)
        metrics["val/num_samples"] = float(len(outputs))
        metrics.update(trajectory_metrics(turns, tool_calls))
        return ValidationResult(metrics=metrics, samples=self._samples(inputs, outputs, infos["reward"], segments,
                                                                       global_step))

    def _samples(self, inputs, outputs, scores, segments, step: int) -> list[dict[str, Any]]:
        """A fixed, seeded selection so the same prompts are shown at every validation (as verl does)."""
        k = min(self.num_log_samples, len(outputs))
        if k <= 0:
            return []
        order = np.random.RandomState(self.seed).permutation(len(outputs))[:k]
        samples = []
        for i in order:
            sample = {"step": step, "prompt": inputs[i], "response": outputs[i], "score": float(scores[i])}
            if any(mask == 0 for _, mask in segments[i]):  # observations inside: keep what is whose
                sample["segments"] = [[text, mask] for text, mask in segments[i]]
            samples.append(sample)
        return samples


def add_answer_variants(columns: dict[str, list[Any]], before: int, batch, responses: list[str]) -> None:
    """Extend ``columns`` (name -> one value per sample so far, ``before`` of them) with the strict and lenient
    accuracies of the math rows of ``batch`` (``rewards/scorers/answer_variants.py``); other rows get None."""
    nt = batch.non_tensor_batch
    sources = nt.get("data_source")
    reward_models = nt.get("reward_model")
    if sources is None or reward_models is None:
        return
    for i, response in enumerate(responses):
        truth = reward_models[i].get("ground_truth") if isinstance(reward_models[i], dict) else None
        for name, value in answer_variants(str(sources[i]), response, truth).items():
            column = columns.setdefault(name, [])
            column.extend([None] * (before + i - len(column)))
            column.append(value)


def trajectory_metrics(turns: list[int], tool_calls: list[float]) -> dict[str, float]:
    """verl's ``val-aux/num_turns/*`` and the tool-call statistics of agent-loop trajectories ({} if none)."""
    metrics: dict[str, float] = {}
    if turns:
        metrics.update({"val-aux/num_turns/min": float(min(turns)), "val-aux/num_turns/max": float(max(turns)),
                        "val-aux/num_turns/mean": float(np.mean(turns))})
    if tool_calls:
        metrics["val-aux/agent/tool_calls_per_trajectory/mean"] = float(np.mean(tool_calls))
        metrics["val-aux/agent/tool_call_rate"] = float(np.mean([c > 0 for c in tool_calls]))
    return metrics


__all__ = ["ValidationResult", "Validator", "add_answer_variants", "trajectory_metrics"]
