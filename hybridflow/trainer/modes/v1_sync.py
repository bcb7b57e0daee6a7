"""verl's V1 ``sync`` mode: the synchronous step, its groups passed through the replay buffer's synchronous rules.

Generation is the synchronous mode's (the same call, prompts, seeds and stages), so a run whose buffer evicts
nothing trains bit for bit what ``trainer.use_v1=false`` trains. One step::

    generate  data.train_batch_size prompts -> rollout -> reward; their groups go into the buffer
    evict     failed groups (sampler.sync_refill_failed_groups) and DAPO-filtered ones (filter_groups), each
              earning refill prompts: generate those too, until data.train_batch_size groups are sampleable
    select    the oldest data.train_batch_size groups (the surplus is discarded and counted)
    train     the PPO stages and the weight push

* ``trainer.v1.sampler.sync_refill_failed_groups=true``: a group with a failed trajectory (its agent loop raised)
  is evicted and one fresh prompt is generated in its place (without it, failed groups are trained as today:
  their rows carry no loss);
* ``algorithm.filter_groups.enable=true`` (DAPO): a group whose trajectories all score the same metric is
  evicted and earns two refill prompts (verl's credit), dispatched at most ``data.train_batch_size x
  filter_groups.max_inflight_gen_batches`` per round; ``filter_groups.max_num_gen_batches`` (> 0) bounds the
  rounds of a step, as in the synchronous DAPO step.

Refill prompts are taken one by one from the data stream (the rest of a loader batch is kept for the next step),
and a checkpoint records where in a loader batch the stream stands, so a resumed run continues with the same
prompts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from hybridflow.config.v1 import v1_settings
from hybridflow.protocol import DataProto
from hybridflow.trainer import ppo_step, stages
from hybridflow.trainer.asynchronous.replay_buffer import SamplingRules, load_replay_buffer
from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.modes.base import BatchSource
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.weight_sync import PushAfterUpdate

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["V1SyncMode"]

_ROWS_KEY = "v1_sync_rows_taken"


class _PromptRows:
    """The prompt stream, exactly ``k`` rows at a time (a refill takes part of a loader batch)."""

    def __init__(self, loader: Any):
        self.loader = loader
        self.rows: DataProto | None = None  # prompts of the current loader batch
        self.taken = 0  # how many of them were taken
        self.state_before: dict[str, Any] | None = None  # loader position before that batch
        self.skip = 0  # resume: rows of the next loader batch already taken before the checkpoint

    def take(self, prompts: Iterator[dict[str, Any]], k: int) -> DataProto | None:
        parts, need = [], k
        while need > 0:
            if self.rows is None or self.taken >= len(self.rows):
                state = getattr(self.loader, "state_dict", None)
                before = state() if callable(state) else None
                batch_dict = next(prompts, None)
                if batch_dict is None:
                    return None
                self.rows, self.taken, self.state_before = stages.prompts_from_loader(batch_dict), 0, before
                if self.skip:
                    self.taken, self.skip = self.skip, 0
                    continue
            count = min(need, len(self.rows) - self.taken)
            if self.taken == 0 and count == len(self.rows):
                parts.append(self.rows)  # a whole loader batch, as the synchronous mode takes it
            else:
                parts.append(self.rows.slice(self.taken, self.taken + count))
            self.taken += count
            need -= count
        return parts[0] if len(parts) == 1 else DataProto.concat(parts)

    @property
    def part_taken(self) -> bool:
        return self.rows is not None and 0 < self.taken < len(self.rows) and self.state_before is not None


class V1SyncMode(BatchSource):
    """See the module docstring."""

    name = "v1_sync"

    def __init__(self, config, train_dataloader=None):
        self.weights = PushAfterUpdate()
        s = v1_settings(config).sampler
        self.buffer = load_replay_buffer(s.custom_sampler_path, s.custom_sampler_name,
                                         SamplingRules(refill_failed=s.sync_refill_failed_groups), s.sampler_kwargs)
        self.refilling = (s.sync_refill_failed_groups or bool(config.algorithm.filter_groups.enable)
                          or bool(s.custom_sampler_path))
        self.filter_metric = config.algorithm.filter_groups.metric or "seq_reward"
        self.rows = _PromptRows(train_dataloader)
        self._ordinal = 0

    def step(self, run: Run, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        log = StepLog()
        with log.timed("step"):
            batch = self._collect(run, prompts, log) if self.refilling else ppo_step.collect(run, prompts, log)
            if batch is None:
                return None
            batch = ppo_step.train(run, batch, log)
        ppo_step.step_metrics(run, batch, log)
        return log.metrics

    def _collect(self, run: Run, prompts: Iterator[dict[str, Any]], log: StepLog) -> DataProto | None:
        """Generate, evict and refill until the buffer can give ``data.train_batch_size`` groups."""
        k = int(run.config.data.train_batch_size)
        step = run.global_steps + 1
        fg = run.config.algorithm.filter_groups
        per_round = k * int(getattr(fg, "max_inflight_gen_batches", 1) or 1)
        request, rounds, credit, folded = k, 0, 0, {}
        first: DataProto | None = None
        while True:
            if 0 < int(fg.max_num_gen_batches) <= rounds:
                raise RuntimeError(
                    f"V1 sync sampling found fewer than {k} trainable prompt groups after {rounds} generation rounds "
                    f"(algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches}): the task is too easy or "
                    "too hard for the policy, or too many groups fail; raise max_num_gen_batches (<= 0: unlimited)")
            chunk = self.rows.take(prompts, request)
            if chunk is None:
                return None
            batch = ppo_step.generate_and_score(run, chunk, log, step)
            rounds += 1
            first = batch if first is None else first
            self._add_groups(batch, step)
            refill, evicted = self.buffer.evict_sync(step, self._classify if run.plan.filter_groups else None)
            _add_into(folded, evicted)
            credit += refill
            chosen, surplus = self.buffer.select(step, k)
            if chosen is not None:
                _add_into(folded, surplus)
                break
            request = min(credit, per_round)
            if request <= 0:
                raise RuntimeError(f"V1 sync sampling: {k} groups needed, the buffer holds fewer and nothing is left "
                                   "to refill (a custom sampler evicted groups without refill credit)")
            credit -= request
        return self._chosen_batch(run, chosen, first, rounds, folded, step, log)

    def _chosen_batch(self, run: Run, chosen: list[Sample], first: DataProto, rounds: int,
                      folded: dict[str, float], step: int, log: StepLog) -> DataProto:
        log.update(folded)
        log.metrics["train/num_gen_batches"] = float(rounds)
        run.history.trained.extend({"step": step, "ordinal": g.ordinal, "failed": g.failed} for g in chosen)
        run.history.evicted.extend({"ordinal": o, "reason": r, "step": st} for o, r, st in
                                   self.buffer.evicted[len(run.history.evicted):])
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

        flags = []
        for group in groups:
            values = group_metric_values(group.rows, self.filter_metric)
            flags.append(len(values) > 1 and float(np.std(values)) == 0.0)
        return flags

    # ------------------------------------------------------------------ checkpoints
    def data_state(self, run: Run) -> dict[str, Any] | None:
        """The loader position, plus where in the current loader batch the prompts stand when a refill took
        part of it (the rest is generated first after a resume)."""
        if self.rows.part_taken:
            return {**self.rows.state_before, _ROWS_KEY: self.rows.taken}
        return super().data_state(run)

    def restore_data_state(self, run: Run, state: dict[str, Any]) -> None:
        state = dict(state)
        self.rows.skip = int(state.pop(_ROWS_KEY, 0))
        super().restore_data_state(run, state)


def _add_into(total: dict[str, float], values: dict[str, float]) -> None:
    for key, value in values.items():
        total[key] = total.get(key, 0.0) + value
