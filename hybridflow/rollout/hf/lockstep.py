"""The control channel of a sharded ``hf`` engine: the leader tells its followers what each step does.

A model split over ``k`` processes (tensor parallelism in the rollout) runs every forward on all ``k`` of them
together: each computes its heads / MLP columns / vocabulary range and the collectives inside the layers combine
them.  Only the leader (the first rank of the group) serves requests; the followers hold the other shards and must
run exactly the forwards the leader runs, in the same order, on the same rows.

They get there by running the *same* continuous batcher on the same inputs: the batcher is deterministic given the
requests it admits at each step, the logits (identical on every rank: the vocabulary-sharded logits are gathered
before sampling) and its random generator (seeded alike).  So the leader announces, before each step, the requests
it hands the batcher at that step, and every other event that changes the batcher's state (abort, reseed, sleep); a follower applies the same events to its own batcher and its own KV cache (its heads only).  What
crosses the channel is small (token ids and sampling parameters, never tensors of the model) and goes over a gloo
group of its own, apart from the model's collectives.

Every wait has a timeout: the group's (``timeout_s``); an idle leader sends a keep-alive every ``keepalive_s`` so
that a follower waiting for the next step through a long pause (agent loops calling tools) does not time out.
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch.distributed as dist

__all__ = ["LockstepChannel", "Message", "ShardGroup", "rollout_shard_groups"]

STEP, ABORT, RESEED, SLEEP, NOOP = "step", "abort", "reseed", "sleep", "noop"


@dataclass(frozen=True)
class Message:
    """One event of the leader's batcher: ``kind`` (STEP, ABORT, RESEED, SLEEP, NOOP) and its payload
    (STEP: the requests admitted to the step as ``(request_id, prompt_ids, params)``; RESEED: the seed; SLEEP:
    whether the KV cache is freed)."""

    kind: str
    payload: Any = None


@dataclass(frozen=True)
class ShardGroup:
    """The ranks of one rollout shard group (one replica), in shard order; ``index``: this rank's shard."""

    ranks: tuple[int, ...]
    index: int
    replica: int

    @property
    def leader(self) -> int:
        return self.ranks[0]

    @property
    def is_leader(self) -> bool:
        return self.index == 0

    @property
    def size(self) -> int:
        return len(self.ranks)


def rollout_shard_groups(world: int, tp_rollout: int, tp_train: int = 1) -> list[tuple[int, ...]]:
    """The rollout's shard groups (tp_r ranks each, world / tp_r micro-data-parallel replicas).

    When the training tp is a multiple of the rollout's (t = m x t_r), a group takes one rank out of every m
    consecutive ranks of a training tp group -- HybridFlow's grouping (§5): rank i of a training tp group gets
    rollout shard i // m, which holds its own training shard, so the switch only gathers within the m ranks sharing
    a rollout shard and keeps no copy a rank already has.  Otherwise consecutive ranks form a group."""
    if tp_rollout < 1 or world % tp_rollout:
        raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp_rollout} must divide the "
                         f"{world} ranks of the actor/rollout workers")
    if tp_train > tp_rollout and tp_train % tp_rollout == 0 and world % tp_train == 0:
        m = tp_train // tp_rollout
        groups = []
        for base in range(0, world, tp_train):
            for offset in range(m):
                groups.append(tuple(base + offset + j * m for j in range(tp_rollout)))
        return groups
    return [tuple(range(base, base + tp_rollout)) for base in range(0, world, tp_rollout)]


class LockstepChannel:
    """Broadcasts :class:`Message` s from the group's leader to its followers over a gloo group of its own.

    Created collectively (every rank of the world calls :meth:`create` with the same groups, in the same order)."""

    def __init__(self, group: ShardGroup, process_group, keepalive_s: float):
        self.group = group
        self._pg = process_group
        self.keepalive_s = float(keepalive_s)
        self.last_sent = time.monotonic()
        self._send_lock = threading.Lock()

    @classmethod
    def create(cls, groups: Sequence[tuple[int, ...]], rank: int, timeout_s: float,
               keepalive_s: float = 5.0) -> "LockstepChannel":
        mine = None
        for replica, ranks in enumerate(groups):
            pg = dist.new_group(list(ranks), backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
            if rank in ranks:
                mine = cls(ShardGroup(tuple(ranks), ranks.index(rank), replica), pg, keepalive_s)
        if mine is None:
            raise ValueError(f"rank {rank} is in none of the rollout shard groups {list(groups)}")
        return mine

    def send(self, message: Message) -> None:
        """Leader only: hand ``message`` to every follower (returns when each has it)."""
        if not self.group.is_leader:
            raise RuntimeError("only the leader of a rollout shard group sends steps")
        if self.group.size == 1:
            return
        with self._send_lock:
            dist.broadcast_object_list([message], src=self.group.leader, group=self._pg)
            self.last_sent = time.monotonic()

    def receive(self) -> Message:
        """Follower only: the leader's next message (the group's timeout bounds the wait)."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.group.leader, group=self._pg)
        return box[0]
