"""What the streaming modes (fully async, V1 colocate_async / separate_async) share: the prompt stream with its
ordinals, the batch laid out from finished samples, and the ledger of samples that must never be generated again.

Each prompt of the run's stream has an ordinal (its position in the stream of loader batches). A sample is trained
(or, in V1, evicted) once; the ledger keeps a *frontier* (every ordinal below it is done) and the few done beyond
it, which is what a checkpoint records, so a resumed run generates every other sample of the stream exactly once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from hybridflow.agents.loop_manager import summarize_trajectory_metrics
from hybridflow.agents.loop_worker import stack_outputs
from hybridflow.protocol import DataProto
from hybridflow.trainer import ppo_step, stages
from hybridflow.trainer.asynchronous.rollouter import sample_stream
from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.asynchronous.staleness import staleness_metrics, tag_versions
from hybridflow.trainer.run_checkpoint import CheckpointError
from hybridflow.trainer.step_log import StepLog

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["SampleLedger", "assemble"]


def assemble(run: Run, samples: list[Sample], log: StepLog, check: bool = True) -> DataProto:
    """The rollout batch of ``samples``, laid out as the synchronous generation lays out one batch, each row
    tagged with the weight versions that generated it (``check``: count failed trajectories against
    ``trainer.tolerated_failure_fraction``)."""
    n = run.plan.n
    prompts = DataProto.concat([s.prompt for s in samples])
    stages.split_generation_input(prompts)  # the rollout's prompt+response tensors replace the prompt ones
    output = stack_outputs(run.tokenizer, run.config.actor_rollout_ref.rollout,
                           [o for s in samples for o in s.outputs], getattr(run.groups.rollout, "processor", None))
    gen_timing, gen_metrics = summarize_trajectory_metrics([m for s in samples for m in s.trajectory_metrics], output)
    output.meta_info = {"timing": gen_timing, "metrics": gen_metrics}
    batch = stages.merge_generation_output(prompts.repeat(n, interleave=True), output)
    gen_metrics = batch.meta_info.pop("gen_metrics", {})
    log.update(gen_metrics)
    if check:
        ppo_step.check_generation(run, batch, gen_metrics, log)
    log.timing.update(batch.meta_info.pop("gen_timing", {}))
    tag_versions(batch, [s.version_start for s in samples for _ in range(n)],
                 [s.version_end for s in samples for _ in range(n)])
    return batch


class SampleLedger:
    """The ordinals trained or evicted, the staleness counters, and the stream positioned after them."""

    def __init__(self, batch_prompts: int, stream_batch: int):
        self.batch_prompts = int(batch_prompts)  # prompts per trained batch
        self.stream_batch = int(stream_batch)  # prompts per loader batch: ordinal = batch index x this + row
        self.frontier = 0  # every sample ordinal below it was trained on
        self.beyond: set[int] = set()  # trained ordinals above the frontier
        self.stale_samples = 0
        self.stale_trajectories = 0

    @property
    def done(self) -> int:
        return self.frontier + len(self.beyond)

    def stream(self, loader: Any, limit: int):
        """The prompt stream from the first ordinal not yet done, skipping the ones done beyond it."""
        first_batch = self.frontier // self.stream_batch
        loader.load_state_dict({**loader.state_dict(), "epoch": first_batch // len(loader),
                                "consumed": first_batch % len(loader)})
        return sample_stream(loader, self.stream_batch, self.frontier, set(self.beyond), limit)

    def mark_done(self, ordinals: Iterable[int]) -> None:
        """Ordinals the stream must never generate again (trained; V1 also evicted)."""
        self.beyond.update(int(o) for o in ordinals)
        while self.frontier in self.beyond:
            self.beyond.discard(self.frontier)
            self.frontier += 1

    def account(self, run: Run, samples: list[Sample], batch: DataProto, version: int, log: StepLog,
                queue: Any, rollouter: Any, bound: int | None = None) -> None:
        """Staleness (beyond ``bound``: an error), counters and the ledger entries of the samples trained this step."""
        log.update(staleness_metrics(batch, version, bound))
        step = run.global_steps + 1
        for s in samples:
            stale = version - s.version_start
            self.stale_samples += int(stale >= 1)
            self.stale_trajectories += len(s.outputs) if stale >= 1 else 0
            run.history.trained.append({"step": step, "ordinal": s.ordinal, "staleness": stale,
                                        "version_start": s.version_start, "version_end": s.version_end,
                                        "submit_step": s.submit_step})
        self.mark_done(s.ordinal for s in samples)
        run.epoch = samples[-1].ordinal // (self.stream_batch * len(run.train_dataloader))
        log.update({
            "fully_async/count/stale_samples_processed": float(self.stale_samples),
            "fully_async/count/stale_trajectory_processed": float(self.stale_trajectories),
            "fully_async/count/current_param_version": float(version),
            "monitor/queue/mq_queue_size": float(queue.size()),
            "monitor/active_tasks_size": float(rollouter.active if rollouter is not None else 0),
        })

    # ------------------------------------------------------------------ checkpoints
    def state(self, weights: Any, **extra: Any) -> dict[str, Any]:
        return {"frontier": self.frontier, "beyond": sorted(self.beyond), "param_version": weights.version,
                "local_step": weights.local_step, "stale_samples": self.stale_samples,
                "stale_trajectories": self.stale_trajectories, "batch_prompts": self.batch_prompts, **extra}

    def restore(self, state: dict[str, Any], weights: Any) -> None:
        if int(state["batch_prompts"]) != self.batch_prompts:
            raise CheckpointError(f"the checkpoint's trainer steps took {state['batch_prompts']} prompts, this run's "
                                  f"take {self.batch_prompts}; resume with the same require_batches x "
                                  "ppo_mini_batch_size")
        self.frontier, self.beyond = int(state["frontier"]), set(int(o) for o in state["beyond"])
        weights.version, weights.local_step = int(state["param_version"]), int(state["local_step"])
        self.stale_samples, self.stale_trajectories = int(state["stale_samples"]), int(state["stale_trajectories"])
