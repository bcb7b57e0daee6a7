"""One-step-off-policy training: generation of batch k+1 overlaps training on batch k (verl's one_step_off_policy).

The step is the synchronous one (same stages, same rollout floor); only *when* generation runs and weights
move differs.  With the rollout on its own pool (``actor_rollout_ref.hybrid_engine=false``), step k

1. waits for batch k, generated (and scored) in the background during step k-1;
2. pushes the actor's current weights (after k-1 updates) to the replicas;
3. starts generating batch k+1 with them in the background;
4. trains on batch k -- sampled by the weights after k-2 updates, so the policy lag is exactly one update
   (zero on the first step, and on the first step after a resume, whose batch is generated on the spot).

The lag shows in ``training/staleness/{mean,max}`` and in each sample's ``staleness`` column.  The rollout's
log-probs are pi_old only with ``algorithm.rollout_correction.bypass_mode=true`` (verl's one-step-off default);
otherwise pi_old is recomputed by the actor and ``rollout_correction.rollout_is/rollout_rs`` correct for the
rollout's older policy.  ``timing_s/gen`` is the time the trainer waited for its batch;
``timing_s/generate_async`` how long that batch took to generate; ``trainer/idle_ratio`` and
``rollouter/idle_ratio`` are the waiting shares of the step on either side.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Iterator

from hybridflow.protocol import DataProto
from hybridflow.trainer import stages
from hybridflow.trainer.ppo_trainer import PPOTrainer
from hybridflow.trainer.asynchronous.staleness import staleness_metrics, tag_versions
from hybridflow.trainer.stages import timed

__all__ = ["OneStepOffTrainer", "separate_validation_rollout"]


def separate_validation_rollout(trainer: PPOTrainer) -> None:
    """Give validation its own agent-loop manager over the same replicas: it then runs beside the background
    generation without sharing agent-loop workers (whose routing state belongs to one event loop)."""
    import dataclasses

    from hybridflow.agents import AgentLoopManager

    if trainer.validator is None:
        return
    train_manager = trainer.groups.rollout
    manager = AgentLoopManager(trainer.config, train_manager.fleet, trainer.config.trainer.backend,
                               tokenizer=trainer.tokenizer, processor=getattr(train_manager, "processor", None))
    trainer.validator.groups = dataclasses.replace(trainer.groups, rollout=manager)
    trainer._validation_manager = manager


class OneStepOffTrainer(PPOTrainer):
    """:class:`PPOTrainer` whose batches are generated one step ahead (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="one-step-off-gen")
        self._pending: concurrent.futures.Future | None = None
        self._pending_data_state: dict[str, Any] | None = None
        self.actor_version = 0  # actor updates the replicas have been sent
        self._updates = 0  # actor updates so far
        separate_validation_rollout(self)

    # ------------------------------------------------------------------ generation ahead of training
    def _generate_ahead(self, prompts: Iterator[dict[str, Any]], step: int) -> None:
        state = getattr(self.train_dataloader, "state_dict", None)
        self._pending_data_state = state() if callable(state) else None
        version = self.actor_version

        def job():
            timing: dict[str, float] = {}
            metrics: dict[str, float] = {}
            start = time.perf_counter()
            batch = PPOTrainer.collect_batch(self, prompts, timing, metrics, step=step)
            if batch is not None:
                tag_versions(batch, version, version)
            return batch, timing, metrics, time.perf_counter() - start

        self._pending = self._executor.submit(job)

    def collect_batch(self, prompts, timing, metrics, step=None) -> DataProto | None:
        step = self.global_steps + 1 if step is None else step
        if self._pending is None:  # first step (or first after a resume): nothing was generated ahead
            self._generate_ahead(prompts, step)
        wait_start = time.perf_counter()
        with timed("gen", timing):
            batch, gen_timing, gen_metrics, gen_seconds = self._pending.result()
        waited = time.perf_counter() - wait_start
        self._pending = None
        self._pending_data_state = None
        if batch is None:
            return None
        timing.update({k: v for k, v in gen_timing.items() if k != "gen"})
        timing["generate_async"] = gen_seconds
        metrics.update(gen_metrics)
        if self.actor_version != self._updates:  # push the weights of the last update before generating with them
            with timed("update_weights", timing):
                stages.sync_rollout_weights(self.groups)
            metrics.update(stages.weight_sync_metrics(self.groups))
            self.actor_version = self._updates
        if step < self.total_training_steps:
            self._generate_ahead(prompts, step + 1)
        self._record(batch, step, metrics)
        self._idle = (waited, gen_seconds)
        return batch

    def _record(self, batch: DataProto, step: int, metrics: dict[str, float]) -> None:
        metrics.update(staleness_metrics(batch, self._updates))
        rows = batch.non_tensor_batch
        for i in range(0, len(batch), self.plan.n):  # one entry per prompt (its n samples share everything)
            self.history.trained.append({"step": step, "index": rows["index"][i] if "index" in rows else None,
                                         "staleness": int(rows["staleness"][i])})

    def push_weights(self, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """The update is pushed right before the next generation starts (in :meth:`collect_batch`)."""
        self._updates += 1

    def finish_step_metrics(self, batch, timing, metrics) -> None:
        super().finish_step_metrics(batch, timing, metrics)
        waited, gen_seconds = getattr(self, "_idle", (0.0, 0.0))
        step_seconds = max(timing.get("step", 0.0), 1e-9)
        metrics["trainer/idle_ratio"] = min(1.0, waited / step_seconds)
        metrics["rollouter/idle_ratio"] = max(0.0, 1.0 - gen_seconds / step_seconds)

    # ------------------------------------------------------------------ lifecycle
    def data_state(self) -> dict[str, Any] | None:
        """The loader position before the batch generated ahead: a resumed run generates it again."""
        if self._pending_data_state is not None:
            return dict(self._pending_data_state)
        return super().data_state()

    def load_checkpoint(self) -> bool:
        resumed = super().load_checkpoint()
        self._updates = self.actor_version = max(0, self.global_steps - self.plan.critic_warmup)
        return resumed

    def stop_rollout(self) -> None:
        if self._pending is not None:  # the batch generated ahead is not trained on: cut it short
            fleet = self.groups.rollout.fleet
            while not self._pending.done():
                try:
                    fleet.abort_all()
                except Exception:  # noqa: BLE001 - a dead replica fails the pending job, which ends the wait
                    pass
                try:
                    self._pending.result(timeout=0.5)
                except Exception:  # noqa: BLE001 - timeout (abort again) or the job's own failure
                    pass
            self._pending = None
        self._executor.shutdown(wait=True)
        manager = getattr(self, "_validation_manager", None)
        if manager is not None:
            manager.shutdown()
