"""verl V1's replay-buffer rules: stale / filtered / failed groups evicted once and refilled one for one, ``wait``
blocks for in-flight groups at the threshold, oldest groups first, synchronous credit and surplus."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from hybridflow.protocol import DataProto
from hybridflow.trainer.asynchronous.replay_buffer import (
    FAILED,
    FILTERED,
    STALE,
    SURPLUS,
    ReplayBuffer,
    SamplingRules,
    load_replay_buffer,
)
from hybridflow.trainer.asynchronous.sample_queue import Sample


def _group(ordinal: int, submit_step: int, failed: bool = False) -> Sample:
    outputs = [SimpleNamespace(extra_fields={"agent_error": "Traceback ..." if failed else None})]
    return Sample(ordinal=ordinal, prompt=DataProto(), submit_step=submit_step, outputs=outputs)


def _finish(buffer: ReplayBuffer, *groups: Sample) -> None:
    for g in groups:
        buffer.started(g)
        buffer.finished(g)


def test_drop_evicts_groups_past_the_threshold_and_refills_one_each():
    buffer = ReplayBuffer(SamplingRules(threshold=2, strategy="drop"))
    _finish(buffer, _group(0, submit_step=1), _group(1, submit_step=1), _group(2, submit_step=2),
            _group(3, submit_step=3), _group(4, submit_step=3))
    refills: list[int] = []

    def refill(n):  # the fresh prompts finish at once
        refills.append(n)
        _finish(buffer, *[_group(100 + i, submit_step=4) for i in range(n)])

    chosen, metrics = buffer.sample(4, 3, refill=refill)
    # at step 4 groups of step 1 are 4 steps old and step 2's 3 steps: stale; step 3's (age 2) are kept
    assert refills == [3]
    assert [g.ordinal for g in chosen] == [3, 4, 100]  # oldest submit step first, then stream order
    assert metrics["training/off_policy/evicted_samples"] == 3
    assert metrics["training/off_policy/evicted_samples_staleness/max"] == 4
    assert metrics["training/off_policy/evicted_samples_staleness/min"] == 3
    assert sorted(buffer.evicted) == [(0, STALE, 4), (1, STALE, 4), (2, STALE, 4)]


def test_wait_keeps_old_groups_and_blocks_for_an_in_flight_group_at_the_threshold():
    buffer = ReplayBuffer(SamplingRules(threshold=2, strategy="wait"))
    slow = _group(0, submit_step=2)
    buffer.started(slow)  # still generating, age 2 at step 3: the threshold
    _finish(buffer, _group(1, submit_step=1), _group(2, submit_step=3), _group(3, submit_step=3))
    got: list = []
    taker = threading.Thread(target=lambda: got.append(buffer.sample(3, 2)))
    taker.start()
    time.sleep(0.3)
    assert taker.is_alive()  # enough finished groups, but an in-flight one reached the threshold
    buffer.finished(slow)
    taker.join(timeout=10)
    chosen, metrics = got[0]
    assert [g.ordinal for g in chosen] == [1, 0]  # the age-3 group is trained, not dropped; then the waited one
    assert metrics == {} and buffer.evicted == []


def test_drop_never_blocks_on_slow_groups():
    buffer = ReplayBuffer(SamplingRules(threshold=2, strategy="drop"))
    buffer.started(_group(0, submit_step=1))  # age 3 at step 3, still in flight
    _finish(buffer, _group(1, submit_step=3), _group(2, submit_step=3))
    chosen, _ = buffer.sample(3, 2)
    assert [g.ordinal for g in chosen] == [1, 2]


def test_filtered_and_failed_groups_are_evicted_once_each():
    buffer = ReplayBuffer(SamplingRules(threshold=1, strategy="drop"))
    stale_and_failed = _group(0, submit_step=1, failed=True)
    _finish(buffer, stale_and_failed, _group(1, submit_step=1), _group(2, submit_step=2),
            _group(3, submit_step=2), _group(4, submit_step=2))
    classified: list[int] = []

    def classify(groups):
        classified.extend(g.ordinal for g in groups)
        return [g.ordinal == 2 for g in groups]

    refills: list[int] = []
    chosen, metrics = buffer.sample(2, 2, classify=classify,
                                    refill=lambda n: refills.append(n) or _finish(buffer, *[
                                        _group(10 + i, submit_step=2) for i in range(n)]))
    assert refills == [3]  # three groups evicted: failed (and old) 0, stale 1, filtered 2 -- one refill each
    assert sorted(classified) == [1, 2, 3, 4, 10, 11, 12]  # each finished group classified once, failed ones not
    assert {o: r for o, r, _ in buffer.evicted} == {0: FAILED, 1: STALE, 2: FILTERED}
    assert metrics["training/off_policy/evicted_samples"] == 1
    assert metrics["training/rollout_failure/evicted_samples"] == 1
    assert metrics["training/filter_groups/evicted_samples"] == 1
    assert [g.ordinal for g in chosen] == [3, 4]


def test_the_stream_ending_returns_none_and_a_rollout_failure_is_raised():
    buffer = ReplayBuffer()
    _finish(buffer, _group(0, submit_step=1))
    buffer.close()
    assert buffer.sample(1, 2)[0] is None
    failing = ReplayBuffer()
    failing.fail(RuntimeError("replica 0 died"))
    with pytest.raises(Exception, match="replica 0 died"):
        failing.sample(1, 1)


def test_a_stalled_rollout_is_a_timeout_naming_what_is_in_flight():
    buffer = ReplayBuffer(SamplingRules(stall_timeout_s=0.5))
    buffer.started(_group(0, submit_step=1))
    with pytest.raises(TimeoutError, match="1 in flight"):
        buffer.sample(1, 1)


def test_sync_rules_credit_two_refills_per_filtered_group_and_discard_the_surplus():
    buffer = ReplayBuffer(SamplingRules(refill_failed=False))
    _finish(buffer, *[_group(i, submit_step=1, failed=(i == 3)) for i in range(4)])
    credit, metrics = buffer.evict_sync(1, classify=lambda groups: [g.ordinal == 1 for g in groups])
    assert credit == 2 and metrics == {"training/filter_groups/evicted_samples": 1.0}
    assert buffer.select(1, 4) == (None, {})  # three left: the failed group is kept without refill_failed
    _finish(buffer, _group(4, submit_step=1), _group(5, submit_step=1))
    chosen, surplus = buffer.select(1, 4)
    assert [g.ordinal for g in chosen] == [0, 2, 3, 4]
    assert surplus == {"training/filter_groups/discarded_surplus_samples": 1.0}
    assert (5, SURPLUS, 1) in buffer.evicted and buffer.size() == 0


def test_sync_refill_failed_groups_evicts_them():
    buffer = ReplayBuffer(SamplingRules(refill_failed=True))
    _finish(buffer, _group(0, submit_step=1, failed=True), _group(1, submit_step=1))
    credit, metrics = buffer.evict_sync(1)
    assert credit == 1 and metrics == {"training/rollout_failure/evicted_samples": 1.0}


def test_a_custom_sampler_is_a_subclass_built_with_its_kwargs(tmp_path):
    f = tmp_path / "my_sampler.py"
    f.write_text(
        "from hybridflow.trainer.asynchronous.replay_buffer import ReplayBuffer\n"
        "class Newest(ReplayBuffer):\n"
        "    def _oldest(self, groups, k):\n"
        "        return sorted(groups, key=lambda g: -g.ordinal)[:k * self.sampler_kwargs['stride']:"
        "self.sampler_kwargs['stride']]\n"
        "class NotABuffer:\n    pass\n")
    buffer = load_replay_buffer(str(f), "Newest", SamplingRules(), {"stride": 2})
    _finish(buffer, *[_group(i, submit_step=1) for i in range(5)])
    chosen, _ = buffer.sample(1, 2)
    assert [g.ordinal for g in chosen] == [4, 2]
    with pytest.raises(ValueError, match="subclass"):
        load_replay_buffer(str(f), "NotABuffer", SamplingRules())
