"""verl's V1 ``sync`` mode: the synchronous step, its groups passed through the replay buffer's synchronous rules.

Generation is the synchronous trainer's (the same call, prompts, seeds and stages), so a run whose buffer evicts
nothing trains bit for bit what ``trainer.use_v1=false`` trains.  The buffer acts when its rules do:

* ``trainer.v1.sampler.sync_refill_failed_groups=true``: a group with a failed trajectory (its agent loop raised)
  is evicted and one fresh prompt is generated in its place (without it, failed groups are trained as today:
  their rows carry no loss);
* ``algorithm.filter_groups.enable=true`` (DAPO): a group whose trajectories all score the same metric is
  evicted and earns two refill prompts (verl's credit), dispatched at most ``data.train_batch_size x
  filter_groups.max_inflight_gen_batches`` per round, until ``data.train_batch_size`` groups are sampleable; the
  oldest are trained and the surplus discarded (``training/filter_groups/discarded_surplus_samples``).
  ``filter_groups.max_num_gen_batches`` (> 0) bounds the rounds of a step, as in the synchronous DAPO trainer.

Refill prompts are taken one by one from the data stream (the rest of a loader batch is kept for the next step),
and a checkpoint records where in a loader batch the stream stands, so a resumed run continues with the same
prompts.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from hybridflow.config.v1 import v1_settings
from hybridflow.protocol import DataProto
from hybridflow.trainer import stages
from hybridflow.trainer.asynchronous.replay_buffer import SamplingRules, load_replay_buffer
from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.ppo_trainer import PPOTrainer

__all__ = ["V1SyncTrainer"]

_ROWS_KEY = "v1_sync_rows_taken"


class V1SyncTrainer(PPOTrainer):
    """verl's V1 ``sync`` (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.v1 = v1_settings(self.config)
        s = self.v1.sampler
        self.buffer = load_replay_buffer(s.custom_sampler_path, s.custom_sampler_name,
                                         SamplingRules(refill_failed=s.sync_refill_failed_groups), s.sampler_kwargs)
        self.refilling = s.sync_refill_failed_groups or self.plan.filter_groups or bool(s.custom_sampler_path)
        self._rows: DataProto | None = None  # prompts of the current loader batch not yet generated
        self._rows_taken = 0  # how many of that loader batch were taken
        self._state_before: dict[str, Any] | None = None  # loader position before that batch
        self._skip_rows = 0  # resume: rows of the next loader batch already taken before the checkpoint
        self._ordinal = 0

    # ------------------------------------------------------------------ prompts, exactly k at a time
    def _take(self, prompts: Iterator[dict[str, Any]], k: int) -> DataProto | None:
        parts, need = [], k
        while need > 0:
            if self._rows is None or self._rows_taken >= len(self._rows):
                state = getattr(self.train_dataloader, "state_dict", None)
                before = state() if callable(state) else None
                batch_dict = next(prompts, None)
                if batch_dict is None:
                    return None
                self._rows, self._rows_taken, self._state_before = stages.prompts_from_loader(batch_dict), 0, before
                if self._skip_rows:
                    self._rows_taken, self._skip_rows = self._skip_rows, 0
                    continue
            count = min(need, len(self._rows) - self._rows_taken)
            if self._rows_taken == 0 and count == len(self._rows):
                parts.append(self._rows)  # a whole loader batch, as the synchronous trainer takes it
            else:
                parts.append(self._rows.slice(self._rows_taken, self._rows_taken + count))
            self._rows_taken += count
            need -= count
        return parts[0] if len(parts) == 1 else DataProto.concat(parts)

    # ------------------------------------------------------------------ a step
    def collect_batch(self, prompts, timing, metrics, step=None) -> DataProto | None:
        if not self.refilling:
            return super().collect_batch(prompts, timing, metrics, step)
        k = int(self.config.data.train_batch_size)
        step = self.global_steps + 1
        fg = self.config.algorithm.filter_groups
        per_round = k * int(getattr(fg, "max_inflight_gen_batches", 1) or 1)
        request, rounds, credit, folded = k, 0, 0, {}
        first: DataProto | None = None
        while True:
            if 0 < int(fg.max_num_gen_batches) <= rounds:
                raise RuntimeError(
                    f"V1 sync sampling found fewer than {k} trainable prompt groups after {rounds} generation rounds "
                    f"(algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}): the task is too easy or "
                    "too hard for the policy, or too many groups fail; raise max_num_gen_batches (<= 0: unlimited)")
            chunk = self._take(prompts, request)
            if chunk is None:
                return None
            batch = self.generate_and_score(chunk, timing, metrics, step)
            rounds += 1
            first = batch if first is None else first
            self._add_groups(batch, step)
            refill, evicted = self.buffer.evict_sync(step, self._classify if self.plan.filter_groups else None)
            for key, value in evicted.items():
                folded[key] = folded.get(key, 0.0) + value
            credit += refill
            chosen, surplus = self.buffer.select(step, k)
            if chosen is not None:
                for key, value in surplus.items():
                    folded[key] = folded.get(key, 0.0) + value
                break
            request = min(credit, per_round)
            if request <= 0:
                raise RuntimeError(f"V1 sync sampling: {k} groups needed, the buffer holds fewer and nothing is left "
                                   "to refill (a custom sampler evicted groups without refill credit)")
            credit -= request
        metrics.update(folded)
        metrics["train/num_gen_batches"] = float(rounds)
        self.history.trained.extend({"step": step, "ordinal": g.ordinal, "failed": g.failed} for g in chosen)
        self.history.evicted.extend({"ordinal": o, "reason": r, "step": st} for o, r, st in
                                    self.buffer.evicted[len(self.history.evicted):])
        if rounds == 1 and not folded:
            return first  # nothing evicted: the batch exactly as generated
        out = DataProto.concat([g.rows for g in chosen])
        out.meta_info = {k_: v for k_, v in first.meta_info.items() if k_ != "metrics"}
        return out

    def _add_groups(self, batch: DataProto, step: int) -> None:
        """Put a generated round's groups (rows sharing a ``uid``, adjacent) into the buffer."""
        uids = batch.non_tensor_batch["uid"]
        start = 0
        for end in range(1, len(batch) + 1):
            if end == len(batch) or uids[end] != uids[start]:
                group = Sample(ordinal=self._ordinal, prompt=DataProto(), submit_step=step,
                               rows=batch.slice(start, end))
                self._ordinal += 1
                self.buffer.started(group)
                self.buffer.finished(group)
                start = end

    def _classify(self, groups: list[Sample]) -> list[bool]:
        from hybridflow.trainer.dynamic_sampling import group_metric_values

        metric = self.config.algorithm.filter_groups.metric or "seq_reward"
        flags = []
        for group in groups:
            values = group_metric_values(group.rows, metric)
            flags.append(len(values) > 1 and float(np.std(values)) == 0.0)
        return flags

    # ------------------------------------------------------------------ checkpoints
    def data_state(self) -> dict[str, Any] | None:
        """The loader position, plus where in the current loader batch the prompts stand when a refill took
        part of it (the rest is generated first after a resume)."""
        if self._rows is not None and 0 < self._rows_taken < len(self._rows) and self._state_before is not None:
            return {**self._state_before, _ROWS_KEY: self._rows_taken}
        return super().data_state()

    def restore_data_state(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self._skip_rows = int(state.pop(_ROWS_KEY, 0))
        super().restore_data_state(state)
