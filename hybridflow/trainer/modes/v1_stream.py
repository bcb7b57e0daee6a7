"""What verl's two async V1 modes share: prompts submitted by the trainer, the replay buffer's rules, one step =
``parameter_sync_step`` mini-batches and one weight version.

The machinery is the fully async mode's (the rollouter thread, the prompt stream with its ordinals, the ledger of
done samples); V1 changes *who decides what is generated* and *which groups are trained*:

* the trainer submits prompts (:meth:`Rollouter.grant`): ``num_warmup_batches x data.train_batch_size`` before
  the first step, ``data.train_batch_size`` at the start of every step, and one per evicted group; each group
  records the step that submitted it;
* a mini-batch is the oldest groups the :class:`ReplayBuffer` lets through (``sampler.max_off_policy_threshold``,
  ``drop`` | ``wait``; DAPO-filtered and failed groups evicted and refilled);
* a step trains ``parameter_sync_step`` mini-batches (1 in ``colocate_async``) and ends with one weight version;
  its metrics are folded into one row (:class:`StepMetrics`).

Checkpoints record the ordinals trained *or evicted*, so a resumed run neither trains nor generates any of them
again; groups waiting in the buffer when it stopped come back from the rollout log (``modes/durable_stream.py``,
``trainer.rollout_wal``: finished groups, the mini-batches taken and the evictions since the checkpoint, replayed
as they were), groups in flight are generated again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from hybridflow.config.v1 import v1_settings
from hybridflow.protocol import DataProto
from hybridflow.trainer import ppo_step, stages
from hybridflow.trainer.asynchronous.replay_buffer import SamplingRules, load_replay_buffer
from hybridflow.trainer.asynchronous.rollouter import Rollouter
from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.asynchronous.v1_metrics import StepMetrics, off_policy_metrics, tag_submit_steps
from hybridflow.trainer.modes.durable_stream import STATE_KEY, DurableSamples
from hybridflow.trainer.modes.sample_ledger import SampleLedger, assemble
from hybridflow.trainer.run_checkpoint import CheckpointError
from hybridflow.trainer.step_log import StepLog

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["V1Stream"]

_UNBOUNDED = 1 << 62  # the V1 stream runs until the trainer stops it


class V1Stream:
    """The submitted prompt stream, the replay buffer and the ledger of one V1 async run."""

    def __init__(self, config, train_dataloader):
        self.config = config
        self.v1 = v1_settings(config)
        s = self.v1.sampler
        self.train_batch = int(config.data.train_batch_size)
        self.sync_every = int(self.v1.parameter_sync_step)
        self.ledger = SampleLedger(batch_prompts=self.train_batch // self.sync_every,  # one PPO mini-batch of groups
                                   stream_batch=int(getattr(train_dataloader, "batch_size", self.train_batch)))
        self.queue = load_replay_buffer(s.custom_sampler_path, s.custom_sampler_name,
                                        SamplingRules(threshold=s.max_off_policy_threshold,
                                                      strategy=s.max_off_policy_strategy, refill_failed=True),
                                        s.sampler_kwargs)
        self.rollouter: Rollouter | None = None
        self.durable = DurableSamples()
        self._index = 0  # the mini-batch of the step being trained
        self._evicted_seen = 0

    # ------------------------------------------------------------------ the rollouter, driven by grants
    def start(self, run: Run, version: int, paused: bool) -> None:
        """Start the rollouter over the stream (restoring what the rollout log kept) and submit the warm-up
        batches."""
        restored = self.durable.open(run, f"v1_{self.v1.mode}", self.ledger, self.queue, weights=_Versions(version, self))
        self.rollouter = Rollouter(run.groups.rollout, run.groups.rollout.fleet,
                                   self.ledger.stream(run.train_dataloader, _UNBOUNDED, skip=restored), self.queue,
                                   batch_prompts=self.ledger.stream_batch, max_samples=None, partial_rollout=True,
                                   version=version, paused=paused)
        self.rollouter.start()
        self.rollouter.grant(self.v1.num_warmup_batches * self.train_batch, run.global_steps + 1)

    def submit_step(self, run: Run) -> None:
        """verl: one train batch of prompts submitted at the start of every step."""
        self.rollouter.grant(self.train_batch, run.global_steps + 1)

    def stop(self, run: Run, reopen: bool = True) -> None:
        if self.rollouter is not None:
            self.rollouter.stop(reopen=reopen)
            run.history.abandoned = self.queue.pending()
        self.durable.close(run)

    # ------------------------------------------------------------------ a step's mini-batches
    def mini_batches(self, run: Run, train_one: Callable[[int, StepLog], DataProto | None]):
        """Run ``train_one(index, log)`` for each of the step's mini-batches and fold their metrics into one row
        (``None`` when the data ran out)."""
        self.submit_step(run)
        self.durable.after_checkpoint(run)
        folded = StepMetrics()
        step_log = StepLog()
        with step_log.timed("step"):
            for index in range(self.sync_every):
                self._index = index
                log = StepLog()
                with log.timed("step"):
                    batch = train_one(index, log)
                    if batch is None:
                        return None
                ppo_step.step_metrics(run, batch, log)
                folded.add(log.metrics, len(batch) // max(1, run.plan.n))
        out = folded.result()
        out.update(self.durable.metrics())
        out["timing_s/step"] = step_log.timing["step"]
        return out

    def sample_groups(self, run: Run, log: StepLog) -> list[Sample] | None:
        """A mini-batch from the replay buffer, evicting (and refilling, one prompt per group) as its rules say."""
        step = run.global_steps + 1
        replayed = self.durable.take(self.queue, step, self._index)
        if replayed is not None:  # a resumed run: the mini-batch its crashed run took
            return replayed
        classify = (lambda groups: self._classify(run, groups)) if run.plan.filter_groups else None
        refill = lambda count: self.rollouter.grant(count, run.global_steps + 1)  # noqa: E731
        samples, evicted = self.queue.sample(step, self.ledger.batch_prompts, classify=classify, refill=refill)
        log.update(evicted)
        self._record_evictions(run)
        return samples

    def assemble(self, run: Run, samples: list[Sample], version: int, log: StepLog) -> DataProto:
        """The mini-batch laid out as one synchronous batch, with submit steps, off-policy metrics and the ledger."""
        samples.sort(key=lambda s: s.ordinal)
        batch = assemble(run, samples, log)
        tag_submit_steps(batch, [s.submit_step for s in samples for _ in range(run.plan.n)])
        log.update(off_policy_metrics(batch, version, run.global_steps + 1))
        self.ledger.account(run, samples, batch, version, log, self.queue, self.rollouter)
        self.durable.taken(run.global_steps + 1, self._index, samples)
        return batch

    def _record_evictions(self, run: Run) -> None:
        new = self.queue.evicted[self._evicted_seen:]
        self._evicted_seen = len(self.queue.evicted)
        if new:
            self.ledger.mark_done(ordinal for ordinal, _, _ in new)
            self.durable.evicted(run.global_steps + 1, [ordinal for ordinal, _, _ in new])
            run.history.evicted.extend({"ordinal": o, "reason": r, "step": st} for o, r, st in new)

    def _classify(self, run: Run, groups: list[Sample]) -> list[bool]:
        """DAPO: a group whose trajectories all score the same ``filter_groups.metric`` is filtered out."""
        from hybridflow.trainer.dynamic_sampling import group_metric_values

        metric = self.config.algorithm.filter_groups.metric or "seq_reward"
        flags = []
        for group in groups:
            batch = assemble(run, [group], StepLog(), check=False)
            stages.compute_reward(run.groups, batch, run.reward_fn, False)
            values = group_metric_values(batch, metric)
            flags.append(len(values) > 1 and float(np.std(values)) == 0.0)
        return flags

    # ------------------------------------------------------------------ checkpoints
    def data_state(self, run: Run, loader_state: dict[str, Any] | None, weights: Any) -> dict[str, Any]:
        state = dict(loader_state or {})
        state["fully_async"] = self.ledger.state(weights, v1_mode=self.v1.mode)
        state.update(self.durable.data_state(run, self.ledger))
        return state

    def restore(self, state: dict[str, Any], weights: Any) -> dict[str, Any]:
        """Restore the ledger; returns the loader's part of ``state``."""
        fa = state.get("fully_async") or {}
        if fa.get("v1_mode") != self.v1.mode:
            raise CheckpointError(f"this checkpoint was written by a {fa.get('v1_mode') or 'non-V1'} run; a V1 "
                                  f"{self.v1.mode} run keeps its own ledger of submitted prompts. Resume with the same "
                                  "trainer mode, or start fresh (trainer.resume_mode=disable)")
        self.ledger.restore(fa, weights)
        return {k: v for k, v in state.items() if k not in ("fully_async", STATE_KEY)}


class _Versions:
    """The weight counters the rollout log's restore reads (V1: one version per ``parameter_sync_step``
    mini-batches, the run resumed at a version's start)."""

    def __init__(self, version: int, stream: V1Stream):
        self.version, self.local_step, self.every = int(version), 0, stream.sync_every
