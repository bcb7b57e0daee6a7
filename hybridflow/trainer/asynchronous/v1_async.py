"""What verl's two async V1 modes share: prompts submitted by the trainer, the replay buffer's rules, one step =
``parameter_sync_step`` mini-batches and one weight version.

The machinery is the fully async controller's (:class:`FullyAsyncTrainer`: the rollouter thread, the prompt stream
with its ordinals, the trained-sample ledger, the weight sync); V1 changes *who decides what is generated* and
*which groups are trained*:

* the trainer submits prompts (:meth:`Rollouter.grant`): ``num_warmup_batches x data.train_batch_size`` before
  the first step, ``data.train_batch_size`` at the start of every step, and one per evicted group; each group
  records the step that submitted it;
* a mini-batch is the oldest groups the :class:`ReplayBuffer` lets through (``sampler.max_off_policy_threshold``,
  ``drop`` | ``wait``; DAPO-filtered and failed groups evicted and refilled);
* a step trains ``parameter_sync_step`` mini-batches (1 in ``colocate_async``) and ends with one weight version;
  its metrics are folded into one row (:class:`StepMetrics`).

Checkpoints record the ordinals trained *or evicted* (the ledger of the fully async controller), so a resumed run
neither trains nor generates any of them again; groups in flight or waiting in the buffer when it stopped are
generated again (verl reissues them from their saved prompts).
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.v1 import v1_settings
from hybridflow.protocol import DataProto
from hybridflow.trainer import stages
from hybridflow.trainer.asynchronous.fully_async import FullyAsyncTrainer
from hybridflow.trainer.asynchronous.replay_buffer import SamplingRules, load_replay_buffer
from hybridflow.trainer.asynchronous.rollouter import Rollouter
from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.asynchronous.v1_metrics import StepMetrics, off_policy_metrics, tag_submit_steps
from hybridflow.trainer.stages import timed

__all__ = ["V1AsyncTrainer"]

_UNBOUNDED = 1 << 62  # the V1 stream runs until the trainer stops it


class V1AsyncTrainer(FullyAsyncTrainer):
    """Shared part of ``colocate_async`` and ``separate_async`` (see the module docstring)."""

    partial_rollout = True  # verl's V1 async client always continues interrupted trajectories
    start_paused = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.v1 = v1_settings(self.config)
        s = self.v1.sampler
        self.train_batch = int(self.config.data.train_batch_size)
        self.sync_every = int(self.v1.parameter_sync_step)
        self.batch_prompts = self.train_batch // self.sync_every  # one PPO mini-batch of prompt groups
        self.stream_batch = int(getattr(self.train_dataloader, "batch_size", self.train_batch))
        self.queue = load_replay_buffer(s.custom_sampler_path, s.custom_sampler_name,
                                        SamplingRules(threshold=s.max_off_policy_threshold,
                                                      strategy=s.max_off_policy_strategy, refill_failed=True),
                                        s.sampler_kwargs)
        self._evicted_seen = 0

    # ------------------------------------------------------------------ the rollouter, driven by grants
    def start_rollout(self, resumed: bool) -> None:
        self.rollouter = Rollouter(self.groups.rollout, self.groups.rollout.fleet, self._stream(_UNBOUNDED),
                                   self.queue, batch_prompts=self.stream_batch, max_samples=None,
                                   partial_rollout=self.partial_rollout, version=self.param_version,
                                   paused=self.start_paused)
        self.rollouter.start()
        first_step = self.global_steps + 1
        self.rollouter.grant(self.v1.num_warmup_batches * self.train_batch, first_step)

    def refill(self, count: int) -> None:
        """One fresh prompt per evicted group, submitted by the current step."""
        self.rollouter.grant(count, self.global_steps + 1)

    # ------------------------------------------------------------------ a step: parameter_sync_step mini-batches
    def train_step(self, prompts) -> dict[str, float] | None:
        step = self.global_steps + 1
        self.rollouter.grant(self.train_batch, step)  # verl: one train batch submitted per step
        folded = StepMetrics()
        step_timing: dict[str, float] = {}
        with timed("step", step_timing):
            for index in range(self.sync_every):
                timing: dict[str, float] = {}
                metrics: dict[str, float] = {}
                with timed("step", timing):
                    batch = self.collect_batch(prompts, timing, metrics)
                    if batch is None:
                        return None
                    self.mini_batch_index = index
                    batch = self.train_on_batch(batch, timing, metrics)
                self.finish_step_metrics(batch, timing, metrics)
                folded.add(metrics, len(batch) // max(1, self.plan.n))
        out = folded.result()
        out["timing_s/step"] = step_timing["step"]
        return out

    def collect_batch(self, prompts, timing, metrics, step=None) -> DataProto | None:
        step = self.global_steps + 1
        with timed("gen", timing):
            samples = self.wait_for_groups(step, timing, metrics)
        if samples is None:
            return None
        samples.sort(key=lambda s: s.ordinal)
        batch = self._assemble(samples, timing, metrics)
        tag_submit_steps(batch, [s.submit_step for s in samples for _ in range(self.plan.n)])
        metrics.update(off_policy_metrics(batch, self.param_version, step))
        self._account(samples, batch, metrics)
        with timed("reward", timing):
            metrics.update(stages.compute_reward(self.groups, batch, self.reward_fn, self.plan.use_rm))
        self.check_rewards(batch, metrics)
        return batch

    def wait_for_groups(self, step: int, timing: dict[str, float], metrics: dict[str, float]) -> list[Sample] | None:
        """The mini-batch's groups once they are there (``timing_s/gen`` is this wait)."""
        return self.sample_groups(step, metrics)

    def sample_groups(self, step: int, metrics: dict[str, float]) -> list[Sample] | None:
        """A mini-batch from the replay buffer (evicting and refilling as its rules say)."""
        classify = self._classify if self.plan.filter_groups else None
        samples, evicted = self.queue.sample(step, self.batch_prompts, classify=classify, refill=self.refill)
        metrics.update(evicted)
        self._record_evictions()
        return samples

    def _record_evictions(self) -> None:
        new = self.queue.evicted[self._evicted_seen:]
        self._evicted_seen = len(self.queue.evicted)
        if new:
            self._mark_done(ordinal for ordinal, _, _ in new)
            self.history.evicted.extend({"ordinal": o, "reason": r, "step": st} for o, r, st in new)

    def _classify(self, groups: list[Sample]) -> list[bool]:
        """DAPO: a group whose trajectories all score the same ``filter_groups.metric`` is filtered out."""
        import numpy as np

        from hybridflow.trainer.dynamic_sampling import group_metric_values

        metric = self.config.algorithm.filter_groups.metric or "seq_reward"
        flags = []
        for group in groups:
            batch = self._assemble([group], {}, {}, check=False)
            stages.compute_reward(self.groups, batch, self.reward_fn, False)
            values = group_metric_values(batch, metric)
            flags.append(len(values) > 1 and float(np.std(values)) == 0.0)
        return flags

    # ------------------------------------------------------------------ checkpoints
    def data_state(self) -> dict[str, Any] | None:
        state = super().data_state()
        state["fully_async"]["v1_mode"] = self.v1.mode
        return state

    def restore_data_state(self, state: dict[str, Any]) -> None:
        from hybridflow.trainer.run_checkpoint import CheckpointError

        mode = (state.get("fully_async") or {}).get("v1_mode")
        if mode != self.v1.mode:
            raise CheckpointError(f"this checkpoint was written by a {mode or 'non-V1'} run; a V1 {self.v1.mode} run "
                                  "keeps its own ledger of submitted prompts. Resume with the same trainer mode, or "
                                  "start fresh (trainer.resume_mode=disable)")
        super().restore_data_state(state)

    # ------------------------------------------------------------------ validation and checkpoints: per step
    def validate_now(self, last: bool) -> bool:
        freq = self.config.trainer.test_freq
        return freq > 0 and (last or self.global_steps % freq == 0)

    def save_now(self, last: bool) -> bool:
        freq = self.config.trainer.save_freq
        return freq > 0 and (last or self.global_steps % freq == 0)
