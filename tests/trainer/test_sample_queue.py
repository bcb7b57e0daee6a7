"""The queue between the fully async rollouter and the trainer: oldest version first, due samples never left
behind, nothing dropped, a rollouter failure reaches the trainer."""

from __future__ import annotations

import threading
import time

import pytest

from hybridflow.protocol import DataProto
from hybridflow.trainer.asynchronous.sample_queue import RolloutFailed, Sample, SampleQueue


def _sample(ordinal: int, version: int) -> Sample:
    return Sample(ordinal=ordinal, prompt=DataProto(), version_start=version, version_end=version)


def test_oldest_version_first_then_finishing_order():
    q = SampleQueue()
    for ordinal, version in ((5, 1), (2, 0), (9, 1), (3, 0)):
        s = _sample(ordinal, version)
        q.started(s)
        q.finished(s)
    assert [s.ordinal for s in q.take(3)] == [2, 3, 5]
    assert q.size() == 1 and q.outstanding() == 1


def test_a_due_sample_in_flight_is_waited_for_when_the_version_has_no_room_left():
    q = SampleQueue()
    slow = _sample(0, version=0)  # started at version 0, still generating (a partial rollout)
    q.started(slow)
    for ordinal in range(1, 5):
        s = _sample(ordinal, version=1)
        q.started(s)
        q.finished(s)
    # trainer at version 1, max staleness 1: the version-0 sample is due, but a later step of this version
    # (room for 2 more) can still take it, so the fresh samples go now
    assert [s.ordinal for s in q.take(2, due_version=0, room_after=2)] == [1, 2]
    # the version's last step (no room after it): the due sample must be in it
    got: list = []
    taker = threading.Thread(target=lambda: got.append(q.take(2, due_version=0, room_after=0)))
    taker.start()
    time.sleep(0.2)
    assert taker.is_alive()  # two finished samples are there, but the due one is still in flight
    q.finished(slow)
    taker.join(timeout=10)
    assert [s.ordinal for s in got[0]] == [0, 3]


def test_a_due_sample_may_wait_while_later_steps_of_the_version_can_hold_it():
    q = SampleQueue()
    q.started(_sample(0, version=0))
    for ordinal in (1, 2):
        s = _sample(ordinal, version=1)
        q.started(s)
        q.finished(s)
    assert [s.ordinal for s in q.take(2, due_version=1, room_after=2)] == [1, 2]


def test_the_end_of_the_stream_and_failures_reach_the_trainer():
    q = SampleQueue()
    s = _sample(0, 0)
    q.started(s)
    q.finished(s)
    q.close()
    assert q.take(2) is None  # fewer than a step's worth and nothing more will come
    failing = SampleQueue()
    failing.fail(RuntimeError("rollout replica 'rollout/replica0' failed"))
    with pytest.raises(RolloutFailed, match="rollout/replica0"):
        failing.take(1)
