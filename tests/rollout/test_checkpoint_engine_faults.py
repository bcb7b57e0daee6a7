"""A weight-sync member that fails half-way makes the others fail within a second, not at the group's timeout.

Members are threads of this process over gloo, as in test_checkpoint_engine.py; the group's timeout is 60 s,
so a test that passes in seconds proves that the failing member's ``abort`` closed the group under the others.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from hybridflow.rollout.weights.checkpoint_engine import BroadcastCheckpointEngine, WeightSyncSpec, free_port

TIMEOUT_S = 60  # what the others would wait without the abort
FAST_S = 5.0


def _tensors(n=12):
    g = torch.Generator().manual_seed(0)
    return [(f"w{i}", torch.randn(500, generator=g)) for i in range(n)]


def _spec(receivers=2, overlap=False):
    return WeightSyncSpec("gloo", "127.0.0.1", free_port(), 1 + receivers, 2048, overlap, timeout_s=TIMEOUT_S)


def _receivers(spec, fail_rank=None, fail_at=1):
    """Receiver threads; ``fail_rank`` raises while loading its bucket ``fail_at`` (as an engine whose
    ``update_weights`` raises) and aborts, as RolloutServerWorker.receive_weights does.  Returns (threads,
    errors by rank, seconds each thread ran)."""
    errors, seconds = {}, {}

    def receive(rank):
        start = time.monotonic()
        engine = BroadcastCheckpointEngine(spec, rank).connect()
        try:
            for i, bucket in enumerate(engine.receive_buckets()):
                if rank == fail_rank and i == fail_at:
                    raise ValueError(f"replica {rank}: the engine refused bucket {i}")
                [t.clone() for _, t in bucket]
        except BaseException as e:  # noqa: BLE001
            engine.abort(e)
            errors[rank] = e
        seconds[rank] = time.monotonic() - start

    threads = [threading.Thread(target=receive, args=(r,), daemon=True) for r in range(1, spec.world_size)]
    for t in threads:
        t.start()
    return threads, errors, seconds


@pytest.mark.parametrize("overlap", [False, True])
def test_a_receiver_failing_half_way_fails_the_sender_and_the_other_receiver_fast(overlap):
    spec = _spec(overlap=overlap)
    threads, errors, seconds = _receivers(spec, fail_rank=1)
    sender = BroadcastCheckpointEngine(spec, 0).connect()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Connection closed by peer|Connection reset by peer"):
        sender.send_weights(iter(_tensors()))
    assert time.monotonic() - start < FAST_S
    for t in threads:
        t.join(FAST_S)
    assert not any(t.is_alive() for t in threads)
    assert "refused bucket 1" in str(errors[1])
    assert 2 in errors and seconds[2] < FAST_S + 2  # the bystander learned it too, without waiting 60 s
    with pytest.raises(RuntimeError, match="left its group after a failure"):  # no silent reconnect
        sender.send_weights(iter(_tensors()))


def test_a_sender_whose_weights_fail_half_way_fails_the_receivers_fast():
    spec = _spec()
    threads, errors, seconds = _receivers(spec)

    def weights():
        yield from _tensors()[:5]
        raise OSError("the actor's shard could not be gathered")

    sender = BroadcastCheckpointEngine(spec, 0).connect()
    with pytest.raises(OSError, match="could not be gathered"):
        sender.send_weights(weights())
    for t in threads:
        t.join(FAST_S)
    assert not any(t.is_alive() for t in threads)
    assert set(errors) == {1, 2} and max(seconds.values()) < FAST_S + 2


def test_the_fleet_raises_the_failing_replica_s_own_error_not_the_sender_s_closed_connection():
    """StandaloneFleet.update_weights: a replica that fails makes the sender fail with "connection closed by
    peer"; the error raised is the replica's (the cause)."""
    from hybridflow.rollout.service.standalone_fleet import _Background, _together

    def receive():
        time.sleep(0.2)
        raise ValueError("replica 1: bucket 3 does not fit the engine's model")

    def send():
        time.sleep(0.3)
        raise RuntimeError("[gloo pair.cc] Connection closed by peer [127.0.0.1]:4242")

    with pytest.raises(ValueError, match="does not fit") as raised:
        _together(send, _Background(receive), timeout_s=10)
    assert "Connection closed by peer" in str(raised.value.__cause__)

    def send_fails_first():
        raise OSError("the actor's shards could not be gathered")

    with pytest.raises(OSError, match="could not be gathered"):  # the sender's own error stays the cause
        _together(send_fails_first, _Background(receive), timeout_s=10)
    assert _together(lambda: "sent", _Background(lambda: ["ok"]), timeout_s=10) == ("sent", ["ok"])
