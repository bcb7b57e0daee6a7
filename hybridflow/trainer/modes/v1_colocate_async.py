"""verl's V1 ``colocate_async``: rollout and training share the devices; a step trains on the first groups to
finish, generation is interrupted for the update and resumed on the new weights.

The rollout is the hybrid engine (the ``hf`` engine generating with the actor's own module, on the same devices,
in the same processes). ``num_warmup_batches`` extra batches are submitted before the first step, so a step finds
more groups in flight than it trains on and takes the first ``data.train_batch_size`` that finish (oldest
submission first); the slow tail keeps generating in the next step's window instead of stalling this one.
One step::

    submit    data.train_batch_size prompts (plus one per group the buffer evicts)
    open      wake the engine, open the servers' gates: generation runs (interrupted requests continue first)
    sample    the first groups to finish, from the replay buffer (timing_s/gen: the wait)
    close     close the gates, cut in-flight requests short (they keep their tokens), put the engine to sleep
    assemble  lay the groups out as one batch; submit steps, off-policy metrics, the ledger
    score     the reward
    train     the PPO stages
    version   one more weight version: nothing moves for the hf engine -- the update *is* the new policy; the
              next wake-up unshards the updated module, so the continued requests sample from it

Validation during a run opens the same window (its requests run beside the continued training trajectories, as in
verl) and closes it again. Weight versions count updates: a trajectory continued after an update records both
versions (``param_version_start`` < ``param_version_end``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hybridflow.trainer import ppo_step
from hybridflow.trainer.modes.base import BatchSource
from hybridflow.trainer.modes.validation_rollout import separate_validation_rollout
from hybridflow.trainer.modes.v1_stream import V1Stream
from hybridflow.trainer.step_log import StepLog
from hybridflow.trainer.weight_sync import VersionedPush

if TYPE_CHECKING:
    from hybridflow.protocol import DataProto
    from hybridflow.trainer.run_view import Run

__all__ = ["V1ColocateAsyncMode"]


class _GenerationWindow:
    """The fleet as validation's agent-loop manager sees it: waking it opens the mode's generation window
    (engine awake, gates open, rollouter running), sleeping closes it -- the training trajectories in flight are
    interrupted again, not dropped."""

    def __init__(self, mode: "V1ColocateAsyncMode", run: Run):
        self.mode, self.run = mode, run
        self.replicas = run.groups.rollout.fleet.replicas

    def wake_up(self, global_step: int | None = None) -> None:
        self.mode.open_window(self.run)

    def sleep(self) -> None:
        self.mode.close_window(self.run)

    def update_weights(self) -> float | None:
        return None

    def abort_all(self) -> None:
        self.run.groups.rollout.fleet.abort_all()


class V1ColocateAsyncMode(BatchSource):
    """See the module docstring."""

    name = "v1_colocate_async"

    def __init__(self, config, train_dataloader=None):
        self.stream = V1Stream(config, train_dataloader)
        self.weights = VersionedPush(every=1, sync_at_start=False)
        self._window_open = False
        self._validation_manager: Any = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, run: Run, resumed: bool) -> None:
        self._validation_manager = separate_validation_rollout(run)
        if self._validation_manager is not None:  # validation generates inside the window, never sleeping the engine
            self._validation_manager.fleet = _GenerationWindow(self, run)
        run.groups.rollout.fleet.interrupt()  # gates closed: requests wait until the first window opens
        self.stream.start(run, self.weights.version, paused=True)

    def stop(self, run: Run) -> None:
        if self.stream.rollouter is not None:
            self.close_window(run)
            self.stream.stop(run, reopen=False)  # requests waiting at the closed gates end with the servers
        if self._validation_manager is not None:
            self._validation_manager.shutdown()

    # ------------------------------------------------------------------ the generation window
    def open_window(self, run: Run) -> None:
        """Engine awake (the module unsharded with the latest weights), gates open, rollouter starting prompts."""
        if self._window_open:
            return
        run.groups.rollout.fleet.wake_up(run.global_steps + 1)
        self.stream.rollouter.resume(self.weights.version)
        self._window_open = True

    def close_window(self, run: Run) -> None:
        """Interrupt what is in flight (it keeps its tokens and waits at the gates), then the engine sleeps."""
        if not self._window_open:
            return
        self.stream.rollouter.pause()
        run.groups.rollout.fleet.sleep()
        self._window_open = False

    # ------------------------------------------------------------------ a step
    def step(self, run: Run, prompts: Iterator[dict[str, Any]]) -> dict[str, float] | None:
        return self.stream.mini_batches(run, lambda index, log: self._train_groups(run, log))   # submit

    def _train_groups(self, run: Run, log: StepLog) -> DataProto | None:
        with log.timed("gen"):
            self.open_window(run)                                                # open
            try:
                samples = self.stream.sample_groups(run, log)                    # sample
            finally:
                with log.timed("pause_rollout"):
                    self.close_window(run)                                       # close
        if samples is None:
            return None
        batch = self.stream.assemble(run, samples, self.weights.version, log)    # assemble
        ppo_step.score(run, batch, log)                                          # score
        batch = ppo_step.train(run, batch, log)                                  # train
        self.weights.end_batch(run, log)                                         # version
        return batch

    # ------------------------------------------------------------------ checkpoints
    def data_state(self, run: Run) -> dict[str, Any] | None:
        return self.stream.data_state(run, super().data_state(run), self.weights)

    def restore_data_state(self, run: Run, state: dict[str, Any]) -> None:
        super().restore_data_state(run, self.stream.restore(state, self.weights))
