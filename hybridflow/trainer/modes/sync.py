"""The synchronous HybridFlow step (Sheng et al. 2025, §3): generate a batch, then train on it.

One step::

    collect   the next prompt batch -> rollout (n samples each) -> reward (DAPO: more rounds until the
              filtered batch is full)
    train     old log-prob -> reference -> values -> advantage -> update critic -> update actor
    push      the new weights to the rollout (nothing moves for the colocated hf engine, which generates with
              the actor's own module)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hybridflow.trainer import ppo_step
from hybridflow.trainer.modes.base import BatchSource
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.weight_sync import PushAfterUpdate

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["SyncMode"]


class SyncMode(BatchSource):
    """See the module docstring."""

    name = "sync"

    def __init__(self, config, train_dataloader=None):
        self.weights = PushAfterUpdate()

    def step(self, run: Run, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        log = StepLog()
        with log.timed("step"):
            batch = ppo_step.collect(run, prompts, log)        # generate and score
            if batch is None:
                return None                                     # the data ran out
            batch = ppo_step.train(run, batch, log)            # the stages, then the weight push
        ppo_step.step_metrics(run, batch, log)
        return log.metrics
