"""verl's V1 ``colocate_async``: rollout and training share the devices; a step trains on the first groups to
finish, generation is interrupted for the update and resumed on the new weights.

The rollout is the hybrid engine (the ``hf`` engine generating with the actor's own module, on the same devices,
in the same processes).  ``num_warmup_batches`` extra batches are submitted before the first step, so a step
finds more groups in flight than it trains on and takes the first ``data.train_batch_size`` that finish (oldest
submission first); the slow tail keeps generating in the next step's window instead of stalling this one.
One step::

    submit data.train_batch_size prompts (plus one per group the buffer evicts)
    wake the engine, open the servers' gates          -- generation runs (interrupted requests continue first)
    sample from the replay buffer                     -- timing_s/gen: the wait for the first groups to finish
    interrupt: close the gates, cut in-flight requests short (they keep their tokens), put the engine to sleep
    train (the PPO stages), then the weights: nothing moves for the hf engine -- the update *is* the new policy;
    the next wake-up unshards the updated module, so the continued requests sample from it

Validation during a run opens the same window (its requests run beside the continued training trajectories, as in
verl) and closes it again.  Weight versions count updates: a trajectory continued after an update records both
versions (``param_version_start`` < ``param_version_end``).
"""

from __future__ import annotations

from typing import Any

from hybridflow.trainer import stages
from hybridflow.trainer.asynchronous.v1_async import V1AsyncTrainer
from hybridflow.trainer.stages import timed

__all__ = ["V1ColocateAsyncTrainer"]


class _GenerationWindow:
    """The fleet as validation's agent-loop manager sees it: waking it opens the trainer's generation window
    (engine awake, gates open, rollouter running), sleeping closes it -- the training trajectories in flight are
    interrupted again, not dropped."""

    def __init__(self, trainer: "V1ColocateAsyncTrainer"):
        self.trainer = trainer
        self.replicas = trainer.groups.rollout.fleet.replicas

    def wake_up(self, global_step: int | None = None) -> None:
        self.trainer.open_window()

    def sleep(self) -> None:
        self.trainer.close_window()

    def update_weights(self) -> float | None:
        return None

    def abort_all(self) -> None:
        self.trainer.groups.rollout.fleet.abort_all()


class V1ColocateAsyncTrainer(V1AsyncTrainer):
    """verl's ``colocate_async`` (see the module docstring)."""

    start_paused = True  # nothing generates until the first step opens the window

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._window_open = False
        manager = getattr(self, "_validation_manager", None)
        if manager is not None:  # validation generates inside the trainer's window, never sleeping the engine
            manager.fleet = _GenerationWindow(self)

    @property
    def fleet(self) -> Any:
        return self.groups.rollout.fleet

    # ------------------------------------------------------------------ the generation window
    def start_rollout(self, resumed: bool) -> None:
        self.fleet.interrupt()  # gates closed: requests wait until the first window opens
        super().start_rollout(resumed)

    def open_window(self) -> None:
        """Engine awake (the module unsharded with the latest weights), gates open, rollouter starting prompts."""
        if self._window_open:
            return
        self.fleet.wake_up(self.global_steps + 1)
        self.rollouter.resume(self.param_version)
        self._window_open = True

    def close_window(self) -> None:
        """Interrupt what is in flight (it keeps its tokens and waits at the gates), then the engine sleeps."""
        if not self._window_open:
            return
        self.rollouter.pause()
        self.fleet.sleep()
        self._window_open = False

    def wait_for_groups(self, step, timing, metrics):
        self.open_window()
        try:
            return self.sample_groups(step, metrics)
        finally:
            with timed("pause_rollout", timing):
                self.close_window()

    def _sync(self, timing: dict[str, float], metrics: dict[str, float]) -> None:
        """After the update: a new weight version.  The hf engine shares the actor's module, so nothing is copied
        (``update_weights`` is timed only when an engine holds its own copy); the next window generates with it."""
        self.local_step = 0
        if self._updated:
            moved = stages.sync_rollout_weights(self.groups)
            if moved is not None:
                timing["update_weights"] = moved
                metrics.update(stages.weight_sync_metrics(self.groups))
            self._updated = False
        self.param_version += 1

    def stop_rollout(self) -> None:
        if self.rollouter is not None:
            self.close_window()
            self.rollouter.stop(reopen=False)  # requests waiting at the closed gates end with the servers
            self.history.abandoned = self.queue.pending()
        manager = getattr(self, "_validation_manager", None)
        if manager is not None:
            manager.shutdown()
