"""The rollout log (``trainer/durable/``) as the streaming modes use it: fully async and V1's async modes.

On start the samples a crashed run had finished come back into the queue (or replay buffer) as finished, the
stream skips them, and the steps the crashed run had taken after its last checkpoint are replayed with exactly
their samples (:meth:`DurableSamples.take`). A restored sample that only a replayed version could train (its first
token is newer than the weights the replay reaches) is dropped and generated again. While the run goes on, each
finished sample is logged before the trainer sees it, each step's samples when it takes them, each eviction; a
checkpoint covers them (:meth:`DurableSamples.data_state`, then :meth:`DurableSamples.after_checkpoint`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hybridflow.trainer import run_checkpoint as ckpt
from hybridflow.trainer.asynchronous.sample_queue import Sample, SampleQueue
from hybridflow.trainer.durable.rollout_log import RolloutLog, sample_digest

if TYPE_CHECKING:
    from hybridflow.trainer.modes.sample_ledger import SampleLedger
    from hybridflow.trainer.run_view import Run

__all__ = ["STATE_KEY", "DurableSamples", "committed"]

STATE_KEY = "rollout_log"


def committed(run: Run):
    """``committed(step)``: the checkpoint of ``step`` is complete on disk."""
    root = Path(run.config.trainer.default_local_dir)
    return lambda step: (ckpt.step_dir(root, step) / ckpt.MANIFEST_FILE).is_file()


class DurableSamples:
    """One streaming run's rollout log and the replay it restored (see the module docstring)."""

    def __init__(self):
        self.log: RolloutLog | None = None
        self.replay: dict[tuple[int, int], list[int]] = {}

    def open(self, run: Run, mode: str, ledger: SampleLedger, queue: SampleQueue, weights: Any) -> set[int]:
        """Restore into ``queue`` what the log holds beyond the resumed checkpoint; returns the restored ordinals
        (the stream skips them)."""
        self.log = RolloutLog.open(run.config, mode)
        if self.log is None:
            return set()
        restored = self.log.restore(run.global_steps, ledger.is_done,
                                    fresh=run.config.trainer.resume_mode == "disable")
        replayed = {o for ids in restored.replay.values() for o in ids}
        reach = weights.version + (weights.local_step + len(restored.replay)) // max(1, weights.every)
        samples = [s for o, s in restored.samples.items() if o in replayed or s.version_start <= reach]
        self.log.restored_samples = len(samples)
        ledger.mark_done(restored.evicted)
        queue.restore(samples)
        queue.on_finished = self.log.submit_sample
        self.replay = restored.replay
        return {s.ordinal for s in samples}

    def take(self, queue: SampleQueue, step: int, index: int) -> list[Sample] | None:
        """The samples the crashed run took for mini-batch ``index`` of ``step``, or ``None`` (sample as usual)."""
        ordinals = self.replay.pop((int(step), int(index)), None)
        return None if ordinals is None else queue.take_exact(ordinals)

    def taken(self, step: int, index: int, samples: list[Sample]) -> None:
        if self.log is not None:
            self.log.log_taken(step, index, [s.ordinal for s in samples], [sample_digest(s.outputs) for s in samples])

    def evicted(self, step: int, ordinals: list[int]) -> None:
        if self.log is not None:
            self.log.log_evicted(step, ordinals)

    def data_state(self, run: Run, ledger: SampleLedger) -> dict[str, Any]:
        """The checkpoint's record of the log (base step, the steps trained since it); the log is compacted once
        the checkpoint is complete."""
        if self.log is None:
            return {}
        self.log.checkpoint_started(run.global_steps, ledger.done_now())
        return {STATE_KEY: {"base_step": self.log.base_step, "trained": self.log.trained_since_base()}}

    def after_checkpoint(self, run: Run) -> None:
        if self.log is not None:
            self.log.checkpoint_finished(committed(run))

    def metrics(self) -> dict[str, float]:
        return self.log.metrics() if self.log is not None else {}

    def close(self, run: Run) -> None:
        if self.log is not None:
            self.after_checkpoint(run)
            self.log.close()
