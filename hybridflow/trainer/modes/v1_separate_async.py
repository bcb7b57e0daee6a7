"""verl's V1 ``separate_async``: standalone rollout replicas generate without pause; the trainer takes one PPO
mini-batch at a time and pushes the weights after ``parameter_sync_step`` of them.

This is the fully async machinery (rollouter, standalone replicas, checkpoint-engine sync, partial rollout) run by
V1's rules (``modes/v1_stream.py``): the trainer submits the prompts, the replay buffer decides which groups are
trained, and one step is ``parameter_sync_step`` mini-batches of ``data.train_batch_size / parameter_sync_step``
prompt groups, each trained as soon as it is available, then one weight sync. One step::

    submit    data.train_batch_size prompts (plus one per group the buffer evicts)
    for each of parameter_sync_step mini-batches:
      sample    the oldest groups the replay buffer lets through (timing_s/gen: the wait)
      assemble  lay them out as one batch; submit steps, off-policy metrics, the ledger
      score     the reward
      pi_old    (decoupled) the version's starting weights stand in for the old-log-prob pass
      train     the PPO stages
    push      pause the rollouter (in-flight requests are interrupted and continue on the new weights), push,
              one more weight version, resume

pi_old (verl's decoupled PPO): unless ``algorithm.rollout_correction.bypass_mode=true`` (pi_old = the rollout's
log-probs), every mini-batch of a version computes pi_old with the weights the version started from -- the first
mini-batch with the actor as it is, the later ones with a CPU copy of those weights swapped in for the old-log-prob
pass (``save_actor_weights`` / ``PI_OLD_WEIGHTS``), so the whole version shares one pi_old.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hybridflow.algorithms.batch_ops import PI_OLD_WEIGHTS
from hybridflow.trainer import ppo_step
from hybridflow.trainer.background_validation import before_push
from hybridflow.trainer.modes.base import BatchSource
from hybridflow.trainer.modes.validation_rollout import separate_validation_rollout
from hybridflow.trainer.modes.v1_stream import V1Stream
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.weight_sync import VersionedPush

if TYPE_CHECKING:
    from hybridflow.protocol import DataProto
    from hybridflow.trainer.run_view import Run

__all__ = ["V1SeparateAsyncMode"]

_VERSION_WEIGHTS = "v1_version_start"


class V1SeparateAsyncMode(BatchSource):
    """See the module docstring."""

    name = "v1_separate_async"

    def __init__(self, config, train_dataloader=None):
        self.stream = V1Stream(config, train_dataloader)
        self.weights = VersionedPush(every=self.stream.sync_every)
        self._validation_manager: Any = None

    @classmethod
    def scheduler_steps(cls, config, total: int) -> int:
        """The updates run once per mini-batch, ``parameter_sync_step`` times a step."""
        from hybridflow.config.v1 import v1_settings

        return int(total) * v1_settings(config).parameter_sync_step

    # ------------------------------------------------------------------ lifecycle
    def start(self, run: Run, resumed: bool) -> None:
        self._validation_manager = separate_validation_rollout(run)
        self.weights.start(run, resumed)  # the replicas start from the trainer's weights: this version
        self.stream.start(run, self.weights.version, paused=False)

    def stop(self, run: Run) -> None:
        self.stream.stop(run)
        if self._validation_manager is not None:
            self._validation_manager.shutdown()

    # ------------------------------------------------------------------ a step
    def step(self, run: Run, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        return self.stream.mini_batches(run, lambda index, log: self._train_groups(run, index, log))   # submit

    def _train_groups(self, run: Run, index: int, log: StepLog) -> DataProto | None:
        with log.timed("gen"):
            samples = self.stream.sample_groups(run, log)                        # sample
        if samples is None:
            return None
        batch = self.stream.assemble(run, samples, self.weights.version, log)    # assemble
        ppo_step.score(run, batch, log)                                          # score
        decoupled = self._decoupled_pi_old(run)
        if decoupled:                                                            # pi_old
            if index == 0:
                run.groups.actor_rollout.save_actor_weights(_VERSION_WEIGHTS)    # before the version's 1st update
            else:
                batch.meta_info[PI_OLD_WEIGHTS] = _VERSION_WEIGHTS
        batch = ppo_step.train(run, batch, log)                                  # train
        before_push(run, log, pushes=self.weights.local_step + 1 >= self.weights.every)
        self.weights.end_batch(run, log, self.stream.rollouter)                  # push (after the last one)
        if decoupled and self.weights.version_ended:
            run.groups.actor_rollout.drop_actor_weights(_VERSION_WEIGHTS)
        return batch

    def _decoupled_pi_old(self, run: Run) -> bool:
        """pi_old is recomputed (no bypass) by a separate pass, over more than one mini-batch per version."""
        plan = run.plan
        return self.weights.every > 1 and not (plan.reuse_rollout_log_probs or plan.old_log_prob_in_update)

    # ------------------------------------------------------------------ checkpoints
    def data_state(self, run: Run) -> dict[str, Any] | None:
        return self.stream.data_state(run, super().data_state(run), self.weights)

    def restore_data_state(self, run: Run, state: dict[str, Any]) -> None:
        super().restore_data_state(run, self.stream.restore(state, self.weights))
