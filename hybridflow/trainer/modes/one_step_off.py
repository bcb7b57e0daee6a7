"""One-step-off-policy training (verl's one_step_off_policy): generation of batch k+1 overlaps training on batch k.

The stages and the rollout floor are the synchronous step's; only *when* generation runs and weights move
differs. With the rollout on its own pool (``actor_rollout_ref.hybrid_engine=false``), step k

1. waits for batch k, generated (and scored) in the background during step k-1;
2. pushes the actor's current weights (after k-1 updates) to the replicas;
3. starts generating batch k+1 with them in the background;
4. trains on batch k -- sampled by the weights after k-2 updates, so the policy lag is exactly one update
   (zero on the first step, and on the first step after a resume, whose batch is generated on the spot).

The lag shows in ``training/staleness/{mean,max}`` and in each sample's ``staleness`` column. The rollout's
log-probs are pi_old only with ``algorithm.rollout_correction.bypass_mode=true`` (verl's one-step-off default);
otherwise pi_old is recomputed by the actor and ``rollout_correction.rollout_is/rollout_rs`` correct for the
rollout's older policy. ``timing_s/gen`` is the time the trainer waited for its batch;
``timing_s/generate_async`` how long that batch took to generate; ``trainer/idle_ratio`` and
``rollouter/idle_ratio`` are the waiting shares of the step on either side.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any, Iterator

from hybridflow.protocol import DataProto
from hybridflow.trainer import ppo_step
from hybridflow.trainer.asynchronous.staleness import staleness_metrics, tag_versions
from hybridflow.trainer.modes.base import BatchSource
from hybridflow.trainer.modes.validation_rollout import separate_validation_rollout
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.weight_sync import PushBeforeGeneration

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["OneStepOffMode"]


class OneStepOffMode(BatchSource):
    """See the module docstring."""

    name = "one_step_off"

    def __init__(self, config, train_dataloader=None):
        self.weights = PushBeforeGeneration()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="one-step-off-gen")
        self._pending: concurrent.futures.Future | None = None
        self._pending_data_state: dict[str, Any] | None = None  # the loader position before the pending batch
        self._validation_manager: Any = None

    def start(self, run: Run, resumed: bool) -> None:
        super().start(run, resumed)
        self._validation_manager = separate_validation_rollout(run)

    def resumed(self, run: Run) -> None:
        self.weights.resumed_at(max(0, run.global_steps - run.plan.critic_warmup))

    # ------------------------------------------------------------------ a step
    def step(self, run: Run, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        step = run.global_steps + 1
        log = StepLog()
        with log.timed("step"):
            batch, waited, gen_seconds = self._wait_for_batch(run, prompts, step, log)     # 1.
            if batch is None:
                return None
            self.weights.push_pending(run, log)                                           # 2.
            if step < run.total_training_steps:
                self._generate_ahead(run, prompts, step + 1)                               # 3.
            self._record(run, batch, step, log)
            batch = ppo_step.train(run, batch, log)                                       # 4.
        ppo_step.step_metrics(run, batch, log)
        step_seconds = max(log.timing.get("step", 0.0), 1e-9)
        log.metrics["trainer/idle_ratio"] = min(1.0, waited / step_seconds)
        log.metrics["rollouter/idle_ratio"] = max(0.0, 1.0 - gen_seconds / step_seconds)
        return log.metrics

    def _wait_for_batch(self, run: Run, prompts, step: int, log: StepLog):
        """The batch generated ahead (generated now on the first step, or the first after a resume)."""
        if self._pending is None:
            self._generate_ahead(run, prompts, step)
        start = time.perf_counter()
        with log.timed("gen"):
            batch, gen_log, gen_seconds = self._pending.result()
        waited = time.perf_counter() - start
        self._pending = None
        self._pending_data_state = None
        if batch is not None:
            log.timing.update({k: v for k, v in gen_log.timing.items() if k != "gen"})
            log.timing["generate_async"] = gen_seconds
            log.update(gen_log.metrics)
        return batch, waited, gen_seconds

    def _generate_ahead(self, run: Run, prompts: Iterator[dict[str, Any]], step: int) -> None:
        state = getattr(run.train_dataloader, "state_dict", None)
        self._pending_data_state = state() if callable(state) else None
        version = self.weights.pushed

        def job():
            gen_log = StepLog()
            start = time.perf_counter()
            batch = ppo_step.collect(run, prompts, gen_log, step=step)
            if batch is not None:
                tag_versions(batch, version, version)
            return batch, gen_log, time.perf_counter() - start

        self._pending = self._executor.submit(job)

    def _record(self, run: Run, batch: DataProto, step: int, log: StepLog) -> None:
        log.update(staleness_metrics(batch, self.weights.updates, bound=1))  # one update behind at most
        rows = batch.non_tensor_batch
        for i in range(0, len(batch), run.plan.n):  # one entry per prompt (its n samples share everything)
            run.history.trained.append({"step": step, "index": rows["index"][i] if "index" in rows else None,
                                        "staleness": int(rows["staleness"][i])})

    # ------------------------------------------------------------------ lifecycle
    def data_state(self, run: Run) -> dict[str, Any] | None:
        """The loader position before the batch generated ahead: a resumed run generates it again."""
        if self._pending_data_state is not None:
            return dict(self._pending_data_state)
        return super().data_state(run)

    def stop(self, run: Run) -> None:
        if self._pending is not None:  # the batch generated ahead is not trained on: cut it short
            self._abort_pending(run.groups.rollout.fleet)
        self._executor.shutdown(wait=True)
        if self._validation_manager is not None:
            self._validation_manager.shutdown()

    def _abort_pending(self, fleet: Any) -> None:
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
