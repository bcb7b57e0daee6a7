"""``StandaloneFleet``: rollout replicas on a pool of their own, fed the actor's weights by the checkpoint engine.

The fleet kind of split placement (verl's ``actor_rollout_ref.hybrid_engine=false``) and of both async
training modes.  ``group`` is the worker group of :class:`~hybridflow.workers.rollout_server_worker.
RolloutServerWorker` (Ray actors on the ``rollout`` pool, or one in this process with the local backend);
its methods run on every replica.  ``weight_source`` is the trainer's side of the weight sync::

    weight_source.address() -> (host, port)   # where the group's store listens (the sender's host)
    weight_source.connect(spec)               # the sender joins (blocks until every replica has joined)
    weight_source.send(full) -> dict          # broadcast the weights that changed (all: full); blocks until delivered
    weight_source.commit(verified)            # every replica checked every bucket: the next delta starts from here

:meth:`update_weights` runs the replicas' receive and the sender's send together and returns the seconds it
took (``timing_s/update_weights``); each sync is a new *weight version* (:attr:`version`), which async
training uses to measure staleness.  Syncs are deltas (:mod:`hybridflow.rollout.weights.delta`): a replica that
finds a bucket whose checksum does not match skips it and says so, and the sync is repeated in full
(``weight_sync/checksum_mismatch``); :meth:`sync_metrics` has the ``weight_sync/*`` numbers of the last one.  :meth:`interrupt` / :meth:`resume` bracket a sync during which
in-flight requests are cut short and later continued (partial rollout).

``keep_awake`` (async training): the replicas generate continuously, so :meth:`sleep` must not free their
KV cache under running requests and :meth:`wake_up` must not restart their random streams mid-flight; both
only check that every replica is alive.  A replica that died is reported by name (:class:`ReplicaError`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from hybridflow.engine.transfer_stats import TransferStats
from hybridflow.rollout.weights.checkpoint_engine import WeightSyncSpec
from hybridflow.rollout.service.fleet import RolloutFleet
from hybridflow.rollout.service.replica import ReplicaError

__all__ = ["StandaloneFleet"]


class _Background:
    """Run ``fn`` in a daemon thread (a sender that fails must not leave the caller waiting on receivers)."""

    def __init__(self, fn: Callable[[], Any]):
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True, name="weight-sync-receivers")
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self._error = e

    def result(self, timeout: float | None = None) -> Any:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("the rollout replicas did not finish receiving the weights in time")
        if self._error is not None:
            raise self._error
        return self._result


_PEER_ERROR_WAIT_S = 10.0  # after the sender failed: how long to wait for a receiver's own (root-cause) error


def _together(send: Callable[[], Any], receivers: _Background, timeout_s: float) -> tuple[Any, Any]:
    """Run the sender's side here while ``receivers`` run in the background; ``(sent, received)``.

    A member that fails leaves the weight-sync group at once (the checkpoint engine's ``abort``), so the other
    side fails within a second with a "connection closed by peer" error; the first side's error is the cause
    and is the one raised (a receiver's failure would otherwise hide behind the sender's closed connection)."""
    try:
        sent = send()
    except Exception as send_error:
        try:
            receivers.result(_PEER_ERROR_WAIT_S)
        except TimeoutError:
            pass
        except Exception as receive_error:  # noqa: BLE001 - the receivers failed too: theirs may be the cause
            if _is_peer_closed(send_error) and not _is_peer_closed(receive_error):
                raise receive_error from send_error
        raise
    return sent, receivers.result(timeout_s)


def _is_peer_closed(error: BaseException) -> bool:
    text = str(error)
    return "Connection closed by peer" in text or "Connection reset by peer" in text


class StandaloneFleet(RolloutFleet):
    """Replicas of ``group`` (see the module docstring)."""

    def __init__(self, group: Any, weight_source: Any, *, backend: str, bucket_bytes: int, overlap: bool = False,
                 timeout_s: float = 600.0, keep_awake: bool = False, seed: int = 0, delta: bool = True,
                 check_weights: bool = True):
        self.group = group
        self.weight_source = weight_source
        self.backend = backend
        self.bucket_bytes = int(bucket_bytes)
        self.overlap = bool(overlap)
        self.timeout_s = float(timeout_s)
        self.keep_awake = bool(keep_awake)
        self.seed = int(seed)
        self.delta = bool(delta)
        self.checksum_mismatches = 0
        self.replicas = list(self._guard("rollout_replica", group.rollout_replica))
        self.names = [r.name for r in self.replicas]
        self.version = 0
        self.last_sync: dict[str, float] = {}
        self.last_sent = TransferStats()  # what the actor's rank 0 sent in the last sync
        self._connected = False
        self._asleep = False
        self.check_weights = bool(check_weights)  # trainer.drift.check_weights: digests after a sync and a wake
        self.facts: list[dict] = []  # the last check of every replica (see verify_weights)

    # ------------------------------------------------------------------ health
    def _guard(self, what: str, fn: Callable[..., Any], *args) -> Any:
        """Call a group method; a replica process that died becomes a :class:`ReplicaError` naming it."""
        from hybridflow.controller.errors import WorkerDiedError

        try:
            return fn(*args)
        except WorkerDiedError as e:
            name = self.names[e.rank] if hasattr(self, "names") and e.rank < len(self.names) else f"rank {e.rank}"
            raise ReplicaError(f"rollout replica '{name}' died during {what}: {e.detail.strip()}") from e

    def check(self) -> None:
        """Raise :class:`ReplicaError` naming the first replica whose process died."""
        self._guard("a health check", self.group.ping)

    # ------------------------------------------------------------------ lifecycle
    def wake_up(self, global_step: int | None = None) -> None:
        if self.keep_awake:
            self.check()
            return
        seed = None if global_step is None else self.seed + 7919 * int(global_step)
        self._guard("wake_up", self.group.wake_up_rollout, seed)
        self._asleep = False
        if self._connected:  # woken for a synchronous generation: the replicas must hold the actor's weights now
            self.verify_weights("at wake_up, before generating")

    def sleep(self) -> None:
        if self.keep_awake:
            return
        self._guard("sleep", self.group.sleep_rollout)
        self._asleep = True

    def interrupt(self) -> int:
        """Cut every in-flight request short; they continue after :meth:`resume` (partial rollout)."""
        return int(sum(self._guard("interrupt", self.group.interrupt_rollout)))

    def resume(self) -> None:
        self._guard("resume", self.group.resume_rollout)

    def abort_all(self) -> None:
        self._guard("abort_all", self.group.abort_rollout)

    # ------------------------------------------------------------------ weights
    def _spec(self) -> WeightSyncSpec:
        host, port = self.weight_source.address()
        return WeightSyncSpec(self.backend, host, int(port), 1 + len(self.replicas), self.bucket_bytes,
                              self.overlap, self.timeout_s, self.delta)

    def _connect(self) -> None:
        spec = self._spec()
        receivers = _Background(lambda: self._guard("connect_weight_sync", self.group.connect_weight_sync, spec))
        _together(lambda: self.weight_source.connect(spec), receivers, self.timeout_s)
        self._connected = True

    def update_weights(self) -> float:
        """Broadcast the actor's current weights to every replica (a new weight version); seconds spent."""
        start = time.perf_counter()
        self.check()
        if not self._connected:
            self._connect()
        version = self.version + 1
        sent, received = self._transfer(version, full=False)
        mismatch = sum(int(r.get("corrupt_buckets", 0)) for r in received)
        if mismatch:  # a replica refused a bucket: it holds old bytes there now; send everything again
            self.checksum_mismatches += 1
            self.weight_source.commit(False)
            sent, received = self._transfer(version, full=True)
            if sum(int(r.get("corrupt_buckets", 0)) for r in received):
                raise ReplicaError(f"rollout replicas {self.names} received corrupted weights twice in a row (checksum "
                                   "mismatch after a full resend): the weight-sync transport is unreliable")
        self.weight_source.commit(True)
        self.version = version
        self.verify_weights("after the weight sync")
        seconds = time.perf_counter() - start
        self.last_sent = TransferStats.from_floats(sent or {})
        self.last_sync = {"seconds": seconds, **{f"sent_{k}": float(v) for k, v in (sent or {}).items()},
                          "receive_seconds_max": max((r.get("seconds", 0.0) for r in received), default=0.0),
                          "checksum_mismatch": float(bool(mismatch))}
        return seconds

    def verify_weights(self, when: str) -> list[dict]:
        """Weight versions as facts: every replica's weight digest against the actor's current one
        (:mod:`hybridflow.rollout.weights.digest`); a replica holding other weights is a :class:`ReplicaError`
        naming it (a skipped or failed sync, weights lost across sleep/wake).  Off with
        ``trainer.drift.check_weights=false``."""
        if not self.check_weights:
            return []
        trainer = self.weight_source.digest()
        held = self._guard("a weight digest", self.group.rollout_weights_digest, trainer["names"])
        self.facts = [{"engine": name, "when": when, "held": h, "expected": trainer["digest"],
                       "match": None if h is None or trainer["digest"] is None else h == trainer["digest"]}
                      for name, h in zip(self.names, held)]
        bad = [f for f in self.facts if f["match"] is False]
        if bad:
            raise ReplicaError(
                f"rollout replica '{bad[0]['engine']}' does not hold the trainer's weights {when}: weight digest "
                f"{bad[0]['held']}, the trainer's {trainer['digest']} ({len(bad)} of {len(self.facts)} replicas); "
                f"the last weight version sent is {self.version}: a weight sync was skipped or failed, or the "
                "weights were lost across sleep/wake")
        return self.facts

    def weight_facts(self) -> list[dict]:
        return list(self.facts)

    def _transfer(self, version: int, full: bool) -> tuple[dict, list]:
        receivers = _Background(lambda: self._guard("receive_weights", self.group.receive_weights, version))
        return _together(lambda: self.weight_source.send(full), receivers, self.timeout_s)

    def sync_metrics(self) -> dict[str, float]:
        """``weight_sync/*`` of the last :meth:`update_weights` (see :mod:`hybridflow.rollout.weights.delta`)."""
        s = self.last_sync
        if not s:
            return {}
        return {**self.last_sent.weight_sync_metrics(),
                "weight_sync/checksum_mismatch": s.get("checksum_mismatch", 0.0),
                "weight_sync/checksum_mismatch_total": float(self.checksum_mismatches)}

    def shutdown(self) -> None:
        """Nothing of its own to stop: the worker group (shut down by the trainer's runtime) owns the replicas."""
