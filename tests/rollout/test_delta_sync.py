"""Delta weight sync: only changed tensors travel, every bucket is checksummed and a corrupted byte is caught.

Sender and receivers are threads of this process on a private gloo group (as in test_checkpoint_engine.py).
"""

from __future__ import annotations

import threading

import pytest
import torch

from hybridflow.rollout.weights.checkpoint_engine import BroadcastCheckpointEngine, WeightSyncSpec, free_port
from hybridflow.rollout.weights.delta import DeltaTracker, digest


def _weights():
    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(50, 8, generator=g), "layer.w": torch.randn(8, 8, generator=g),
            "layer.b": torch.randn(8, generator=g), "head": torch.randn(8, 50, generator=g).bfloat16()}


class _Receiver(threading.Thread):
    """A replica: applies every verified bucket to its own copy, ``rounds`` times."""

    def __init__(self, spec, rank, initial, rounds, corrupt_round=None):
        super().__init__(daemon=True)
        self.spec, self.rank, self.rounds, self.corrupt_round = spec, rank, rounds, corrupt_round
        self.held = {k: v.clone() for k, v in initial.items()}
        self.corrupt: list[int] = []
        self.received: list[list[str]] = []
        self.error = None

    def run(self):
        try:
            engine = BroadcastCheckpointEngine(self.spec, self.rank).connect()
            for r in range(self.rounds):
                if r == self.corrupt_round:  # the transport flips one byte of the first bucket it delivers
                    _corrupt_first_bucket(engine)
                names = []
                for bucket in engine.receive_buckets():
                    for name, tensor in bucket:
                        self.held[name].copy_(tensor)
                        names.append(name)
                self.received.append(names)
                self.corrupt.append(engine.corrupt_buckets)
        except BaseException as e:  # noqa: BLE001
            self.error = e


def _corrupt_first_bucket(engine):
    original = engine._post
    state = {"done": False}

    def post(nbytes, slot):
        buf, work = original(nbytes, slot)
        if state["done"]:
            return buf, work

        class Flip:
            def wait(self_inner):
                work.wait()
                buf[nbytes // 2] ^= 0x01  # one bit of one byte, after the bytes arrived
                state["done"] = True

        return buf, Flip()

    engine._post = post


def _spec(receivers, bucket_bytes=256):
    return WeightSyncSpec("gloo", "127.0.0.1", free_port(), receivers + 1, bucket_bytes, False, timeout_s=60)


def test_digest_sees_every_byte_and_the_dtype_and_shape():
    w = torch.randn(100)
    same = w.clone()
    assert digest(w) == digest(same)
    one_byte = w.clone()
    one_byte.view(torch.uint8)[123] ^= 0x80
    assert digest(one_byte) != digest(w)
    assert digest(w.view(10, 10)) != digest(w)
    assert digest(w.view(torch.int32)) != digest(w)


def test_only_the_tensors_that_changed_travel_after_the_first_sync():
    weights = _weights()
    spec = _spec(2)
    stale = {k: torch.zeros_like(v) for k, v in weights.items()}
    receivers = [_Receiver(spec, r, stale, rounds=3) for r in (1, 2)]
    for r in receivers:
        r.start()
    sender = BroadcastCheckpointEngine(spec, 0).connect()
    tracker = DeltaTracker()
    first = sender.send_weights(iter(weights.items()), delta=tracker)
    tracker.commit()
    weights["layer.w"].add_(0.5)  # an update that reached one tensor only (the rest frozen)
    second = sender.send_weights(iter(weights.items()), delta=tracker)
    tracker.commit()
    third = sender.send_weights(iter(weights.items()), delta=tracker)  # nothing changed
    tracker.commit()
    for r in receivers:
        r.join(timeout=60)
        assert r.error is None, r.error
        assert r.received == [list(weights), ["layer.w"], []]
        assert r.corrupt == [0, 0, 0]
        assert all(torch.equal(r.held[k], weights[k]) for k in weights)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    assert (first.bytes, first.skipped) == (total, 0)
    assert (second.bytes, second.tensors, second.skipped) == (8 * 8 * 4, 1, 3)
    assert (third.bytes, third.buckets, third.skipped_bytes) == (0, 0, total)


def test_a_byte_corrupted_in_transit_is_caught_and_the_bucket_not_applied():
    weights = _weights()
    spec = _spec(1, bucket_bytes=0)  # one tensor per bucket
    stale = {k: torch.zeros_like(v) for k, v in weights.items()}
    receiver = _Receiver(spec, 1, stale, rounds=2, corrupt_round=0)
    receiver.start()
    sender = BroadcastCheckpointEngine(spec, 0).connect()
    tracker = DeltaTracker()
    sender.send_weights(iter(weights.items()), delta=tracker)
    tracker.forget()  # the fleet learns of the mismatch and sends everything again
    sender.send_weights(iter(weights.items()), delta=tracker, full=True)
    receiver.join(timeout=60)
    assert receiver.error is None, receiver.error
    assert receiver.corrupt == [1, 0]
    assert receiver.received[0] == list(weights)[1:]  # the corrupted first bucket was refused, not applied
    assert receiver.received[1] == list(weights)
    assert all(torch.equal(receiver.held[k], weights[k]) for k in weights)


@pytest.mark.parametrize("enabled", [True, False])
def test_delta_off_sends_everything_every_time(enabled):
    tracker = DeltaTracker(enabled=enabled)
    weights = _weights()
    list(tracker.select(weights.items()))
    tracker.commit()
    sent = [name for name, _ in tracker.select(weights.items())]
    assert sent == ([] if enabled else list(weights))
