"""Weight-sync policies: when the rollout gets the actor's new weights, one small class per answer.

* :class:`PushAfterUpdate` -- the synchronous modes: after every actor update (the colocated ``hf`` engine
  generates with the actor's own module, so nothing moves and nothing is timed);
* :class:`PushBeforeGeneration` -- one-step-off: updates are counted and pushed right before the next batch
  starts generating, so the replicas never change weights under a batch in flight;
* :class:`VersionedPush` -- fully async and V1's async modes: every ``every`` trained batches one new weight
  version; with a rollouter beside training it is paused for the push and resumed on the new version.

Each policy keeps the version counters the modes and checkpoints read; ``start`` brings replicas that hold their
own copy up to the trainer's weights before the first generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hybridflow.trainer import stages
from hybridflow.trainer.step_log import StepLog

if TYPE_CHECKING:
    from hybridflow.trainer.run_view import Run

__all__ = ["PushAfterUpdate", "PushBeforeGeneration", "VersionedPush", "digest_metrics", "first_sync", "push"]


def push(run: Run, log: StepLog) -> None:
    """Send the actor's weights to the rollout: ``timing_s/update_weights`` and ``weight_sync/*`` when something
    moved (``None`` from the fleet: the replicas share the actor's module)."""
    moved = stages.sync_rollout_weights(run.groups)
    if moved is not None:
        log.timing["update_weights"] = log.timing.get("update_weights", 0.0) + moved
        log.update(stages.weight_sync_metrics(run.groups))
        log.update(digest_metrics(run))


def digest_metrics(run: Run) -> dict[str, float]:
    """``weights/digest_verified`` / ``_unverified``: the engines whose weight digest matched the trainer's at the
    last check (a mismatch already raised, naming the engine), and those that cannot show their weights."""
    read = getattr(run.groups.rollout.fleet, "weight_facts", None)
    facts = read() if callable(read) else []
    if not facts:
        return {}
    return {"weights/digest_verified": float(sum(f.get("match") is True for f in facts)),
            "weights/digest_unverified": float(sum(f.get("match") is None for f in facts))}


def first_sync(run: Run, resumed: bool) -> None:
    """Before the first generation, replicas with their own copy get the actor's weights (a resumed actor differs
    from the model path they were loaded from; the sync also forms the weight-sync group)."""
    if resumed or run.config.split_placement:
        stages.sync_rollout_weights(run.groups)


class PushAfterUpdate:
    """After every actor update (synchronous modes); ``version``: the actor updates the rollout holds."""

    def __init__(self):
        self.version = 0

    def start(self, run: Run, resumed: bool) -> None:
        # a resumed run: one update per step after the critic warm-up
        self.version = max(0, int(run.global_steps) - int(run.plan.critic_warmup))
        first_sync(run, resumed)

    def after_update(self, run: Run, log: StepLog) -> None:
        push(run, log)
        self.version += 1


class PushBeforeGeneration:
    """One-step-off: count the updates; push them right before the next generation starts."""

    def __init__(self):
        self.updates = 0  # actor updates so far
        self.pushed = 0  # updates the replicas have been sent

    def start(self, run: Run, resumed: bool) -> None:
        first_sync(run, resumed)

    def after_update(self, run: Run, log: StepLog) -> None:
        self.updates += 1

    def push_pending(self, run: Run, log: StepLog) -> None:
        """The weights of the last update to the replicas, if they do not have them yet."""
        if self.pushed != self.updates:
            with log.timed("update_weights"):
                stages.sync_rollout_weights(run.groups)
            log.update(stages.weight_sync_metrics(run.groups))
            log.update(digest_metrics(run))
            self.pushed = self.updates

    def resumed_at(self, updates: int) -> None:
        """A resumed run: its replicas are loaded with the checkpoint's weights (``updates`` of them)."""
        self.updates = self.pushed = int(updates)


class VersionedPush:
    """One weight version every ``every`` trained batches (fully async: trainer steps; V1: mini-batches)."""

    def __init__(self, every: int, sync_at_start: bool = True):
        self.every = int(every)
        self.sync_at_start = sync_at_start
        self.version = 0
        self.local_step = 0  # batches trained since the last version
        self.updated = False  # an actor update happened since the last push

    def start(self, run: Run, resumed: bool) -> None:
        if self.sync_at_start:  # the replicas hold the trainer's weights: this version
            stages.sync_rollout_weights(run.groups)

    def after_update(self, run: Run, log: StepLog) -> None:
        self.updated = True

    def end_batch(self, run: Run, log: StepLog, rollouter: Any = None) -> None:
        """A batch was trained: after ``every`` of them, push (if the actor changed) and start a new version --
        also when the critic warm-up left the actor unchanged, since the rollouter's budget is per version."""
        self.local_step += 1
        if self.local_step < self.every:
            return
        self.local_step = 0
        if rollouter is None:  # generation is not running beside training: nothing to pause
            self._push_if_updated(run, log)
            self.version += 1
            return
        with log.timed("param_sync"):
            with log.timed("pause_rollout"):
                rollouter.pause()
            self._push_if_updated(run, log)
            self.version += 1
            log.metrics["rollouter/idle_ratio"] = rollouter.resume(self.version)

    def _push_if_updated(self, run: Run, log: StepLog) -> None:
        if self.updated:
            push(run, log)
            self.updated = False

    @property
    def version_ended(self) -> bool:
        """The last trained batch closed a version (validation and checkpoints of the async modes wait for it)."""
        return self.local_step == 0
