"""Rollout fleets: the replicas of one run plus their lifecycle around generation and weight updates.

The agent-loop manager asks a fleet for its :attr:`replicas` (data plane) and calls, around each
generation, :meth:`wake_up` / :meth:`sleep` (memory: KV cache, and for engines that hold their own copy
of the weights, the weights), and after each actor update :meth:`update_weights`.

:class:`HybridFleet` is HybridFlow's colocated *hybrid engine*: one replica per rank of the actor/rollout
worker group, living in the actor's own processes.  The ``hf`` engine generates with the actor's module
itself, so :meth:`update_weights` moves nothing and reports ``None`` (the trainer then logs no
``timing_s/update_weights``); engines with their own copy (vLLM) reload the actor's weights there.
Other fleets (standalone server actors or processes on their own devices) implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from hybridflow.rollout.service.replica import RolloutReplica

__all__ = ["RolloutFleet", "HybridFleet", "ServerFleet"]


class RolloutFleet(ABC):
    """The replicas of a run and what must happen to them between generations."""

    replicas: list[RolloutReplica]

    @abstractmethod
    def wake_up(self, global_step: int | None = None) -> None:
        """Make every replica ready to generate with the current weights; ``global_step`` restarts the
        engines' own random streams (used by requests without a seed) at a function of the step."""

    @abstractmethod
    def sleep(self) -> None:
        """Release generation memory until the next :meth:`wake_up`."""

    @abstractmethod
    def update_weights(self) -> float | None:
        """Bring the actor's latest weights to the replicas; seconds spent, or ``None`` when nothing moves."""

    def abort_all(self) -> None:
        """Interrupt every in-flight request (they return with finish_reason ``"abort"``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot interrupt requests")

    def shutdown(self) -> None:
        """Stop what this fleet started (nothing for a hybrid fleet: the worker group owns the processes)."""


class HybridFleet(RolloutFleet):
    """One replica per rank of the actor/rollout worker group ``group`` (the colocated hybrid engine).

    ``group`` is the worker group (or its colocated view) of ``ActorRolloutRefWorker``; its methods
    ``rollout_replica``, ``wake_up_rollout``, ``sleep_rollout``, ``sync_rollout_weights`` and
    ``abort_rollout`` run on every rank.  Waking up is a collective (FSDP all-gathers the full weights once
    per generation), so it is always called on all ranks together.
    """

    def __init__(self, group: Any):
        self.last_metrics: dict[str, float] = {}
        self.group = group
        # a rank following its shard group's leader (the hf engine split over ranks) has no replica of its own
        self.replicas = [r for r in group.rollout_replica(group.host_role) if r is not None]

    def wake_up(self, global_step: int | None = None) -> None:
        self.group.wake_up_rollout(global_step)

    def sleep(self) -> None:
        self.group.sleep_rollout()

    def update_weights(self) -> float | None:
        """Seconds of the slowest rank; a rank that streamed its weights in buckets also reports the transition's
        stats (``update_weights/*``: bytes, buckets, peak memory rise), kept as the max over ranks in
        :attr:`last_metrics`."""
        results = [r for r in self.group.sync_rollout_weights() if r is not None]
        self.last_metrics = {}
        for r in results:
            if isinstance(r, dict):
                for k, v in r.items():
                    if k != "seconds":
                        self.last_metrics[k] = max(self.last_metrics.get(k, v), v)
        seconds = [r["seconds"] if isinstance(r, dict) else r for r in results]
        return max(seconds) if seconds else None

    def sync_metrics(self) -> dict[str, float]:
        """The ``weight_sync/*`` and ``update_weights/*`` numbers of the last update, as :meth:`update_weights` got
        them from the ranks (empty when the engine shares the module): no second call to the workers."""
        return dict(self.last_metrics)

    def abort_all(self) -> None:
        self.group.abort_rollout()

    def weight_facts(self) -> list[dict]:
        """Each rank's last weight-digest check (``RolloutHost.weight_fact``: the hosts check after every sync and
        wake-up and raise on a mismatch themselves)."""
        return list(self.group.rollout_weight_fact())

    def interrupt(self) -> int:
        """Cut every in-flight request short for an update; they continue after :meth:`resume` (V1 colocate)."""
        return int(sum(n or 0 for n in self.group.interrupt_rollout()))

    def resume(self) -> None:
        self.group.resume_rollout()


class ServerFleet(RolloutFleet):
    """Replicas served from :class:`RolloutServer` objects in this process (a standalone rollout with
    the local backend, offline generation, tests).  Their engines own their weights: the trainer pushes
    new ones with :meth:`push_weights`; :meth:`update_weights` has nothing to pull on its own."""

    def __init__(self, servers: list):
        from hybridflow.rollout.service.replica import InProcessReplica

        self.servers = list(servers)
        self.replicas = [InProcessReplica(s) for s in self.servers]

    def wake_up(self, global_step: int | None = None) -> None:
        for index, server in enumerate(self.servers):
            server.call(server.engine.wake_up, what="wake_up")
            if global_step is not None:  # the engines' own streams (requests without a seed) restart per step
                server.call(lambda e=server.engine, s=7919 * int(global_step) + index: e.reseed(s), what="reseed")

    def sleep(self) -> None:
        for server in self.servers:
            server.call(server.engine.sleep, what="sleep")

    def update_weights(self) -> float | None:
        return None

    def push_weights(self, named_tensors) -> float:
        """Copy ``named_tensors`` (full, unsharded) into every engine; returns the seconds spent."""
        import time

        start = time.perf_counter()
        tensors = list(named_tensors)
        for server in self.servers:
            server.call(lambda s=server: s.engine.update_weights(tensors), what="weights")
        return time.perf_counter() - start

    def abort_all(self) -> None:
        for server in self.servers:
            server.engine.abort_all()

    def shutdown(self) -> None:
        for server in self.servers:
            server.close()
