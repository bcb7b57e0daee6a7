"""``RolloutHost``: the rollout engine a worker process serves, and the hybrid-engine lifecycle around it.

The actor/rollout worker owns one host.  Between generations the engine sleeps (its KV cache freed, the
FSDP shards of the shared module resharded); for a generation the controller wakes every rank up together
(``wake_up`` unshards the module once: a collective), the agent loops send requests to each rank's server
(:meth:`stream`, called from Ray's rollout thread pool, or in-process), and ``sleep`` undoes the wake-up.

``shares_weights``: the ``hf`` engine built on the actor's own module generates with whatever the last
update left in it, so :meth:`sync_weights` moves nothing and returns ``None`` -- a "sync" there is only the
invalidation of state computed from the old weights (parked prefix K/V, fast decode's packed copies), which the
engine does on wake-up.  An engine with its own copy (vLLM) is sent only the tensors that changed
(:mod:`hybridflow.rollout.weights.delta`).

The server is interruptible (verl's V1 ``colocate_async``): :meth:`interrupt` closes its gate and cuts the
requests in flight short before the engine goes to sleep for an update; they wait at the gate -- as do requests
arriving meanwhile, which :meth:`stream` then accepts while asleep -- and continue on the new weights after
:meth:`wake_up` and :meth:`resume`.  Never interrupted, the gate stays open and costs nothing.  An engine with its own
copy of the weights (vLLM) gets the full, unsharded actor weights pushed into it, and the seconds spent
are returned for ``timing_s/update_weights``.  ``bucket_bytes`` (an ``hf`` engine with its own module or vLLM, next
to an actor split by tensor / expert parallelism) streams them instead: each rank gathers the actor's pieces a
bucket at a time and loads each bucket into the engine (``engine/reshard.py``), never holding a second full copy;
a bucket whose tensors the engine already holds is not loaded (delta, per bucket); the transition's stats (bytes,
buckets, peak memory rise, ``weight_sync/*``) are kept in :attr:`RolloutHost.last_sync`.

Weight versions are facts (:mod:`hybridflow.rollout.weights.digest`): an engine with its own copy is checked by
digest after every sync (it must hold the actor's weights) and every wake-up (it must still hold what the last
sync loaded); a mismatch raises :class:`WeightMismatchError` naming the engine.  :attr:`RolloutHost.weight_fact`
is the last check (``engine``, ``when``, ``held``, ``expected``, ``match``: None when the engine cannot show its
weights or shares the actor's module).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Sequence

import torch

from hybridflow.engine.forward import eval_mode
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.rollout.base import EngineError, RolloutEngine, TokenOutput
from hybridflow.rollout.service.replica import RolloutReplica, replica_for_server
from hybridflow.rollout.service.interruptible_server import InterruptibleRolloutServer
from hybridflow.rollout.service.server import GenerateRequest

__all__ = ["RolloutHost", "WeightMismatchError"]


class WeightMismatchError(EngineError):
    """A rollout engine does not hold the weights it should (the message names the engine and the digests)."""


class RolloutHost:
    """Serves ``engine`` from this process; ``train_engine`` holds the module the weights come from."""

    def __init__(self, engine: RolloutEngine, train_engine: TrainEngine, name: str, shares_weights: bool,
                 stream_method: str = "rollout_stream", delta: bool = True, stall_timeout_s: float = 300.0,
                 bucket_bytes: int | None = None):
        from hybridflow.rollout.weights.delta import DeltaTracker, lora_group, vllm_load_group

        self.engine = engine
        self.train_engine = train_engine
        self.shares_weights = shares_weights
        # an engine with its own copy: only what changed is loaded, grouped as the engine fuses it (LoRA: the
        # adapter, whole, and never the frozen base)
        lora = int(getattr(engine, "lora_rank", 0) or 0) > 0
        self.delta = DeltaTracker(enabled=delta, group_of=lora_group if lora else vllm_load_group)
        self.last_sync: dict[str, float] = {}
        self.checksum_mismatches = 0
        self.stream_method = stream_method
        self.bucket_bytes = bucket_bytes
        self.server = InterruptibleRolloutServer(engine, name=name, stall_timeout_s=stall_timeout_s)
        self._awake: contextlib.ExitStack | None = None
        self.weight_fact: dict[str, Any] = {"engine": name, "when": "start", "match": None,
                                            "why": "shares the actor's module" if shares_weights else "not synced yet"}
        self._synced: tuple[list[str], str] | None = None  # (names, digest) the last verified sync loaded

    # ------------------------------------------------------------------ data plane
    def replica(self, host_role: str | None) -> RolloutReplica:
        return replica_for_server(self.server, self.stream_method, host_role)

    def stream(self, requests: Sequence[GenerateRequest]) -> Iterator[list[tuple[int, TokenOutput | BaseException]]]:
        if self._awake is None and not self.server.interrupted:
            raise RuntimeError(f"rollout server '{self.server.name}' got requests while asleep; the fleet must "
                               "wake_up() every replica before generating")
        yield from self.server.stream(requests)

    # ------------------------------------------------------------------ lifecycle
    def wake_up(self, seed: int | None = None) -> None:
        """Ready to generate: full weights on every rank (a collective), eval mode, engine memory back."""
        if self._awake is not None:
            return
        stack = contextlib.ExitStack()
        try:
            if self.shares_weights:
                module = stack.enter_context(self.train_engine.full_params())
                stack.enter_context(eval_mode(module))
            def wake_up() -> None:  # one call to the server's loop, not two
                self.engine.wake_up()
                if seed is not None:
                    self.engine.reseed(seed)

            self.server.call(wake_up, what="wake_up")
            self._check_after_wake()
        except BaseException:
            stack.close()
            raise
        self._awake = stack

    def sleep(self) -> None:
        """Free generation memory (KV cache) and reshard the module for training."""
        if self._awake is None:
            return
        stack, self._awake = self._awake, None
        try:
            self.server.call(self.engine.sleep, what="sleep")
        finally:
            stack.close()

    def sync_weights(self) -> float | None:
        """Push the actor's weights that changed since the last sync into an engine with its own copy (all of
        them after a failed check); ``None`` when shared.  The ``weight_sync/*`` numbers go to :attr:`last_sync`."""
        if self.shares_weights:
            return None
        if self.bucket_bytes is not None:
            return self._sync_in_buckets()
        from hybridflow.rollout.weights.delta import ChecksumMismatch

        start = time.perf_counter()
        mismatch = False
        with self.train_engine.full_params() as module:
            try:
                self._push(module, full=False)
            except ChecksumMismatch:  # the engine's worker refused the files: nothing loaded; everything again
                mismatch = True
                self.delta.forget()
                self._push(module, full=True)
            self._check_after_sync(module)
        self.delta.commit()
        self.checksum_mismatches += int(mismatch)
        self.last_sync = {**self.delta.stats.weight_sync_metrics(), "weight_sync/checksum_mismatch": float(mismatch),
                          "weight_sync/checksum_mismatch_total": float(self.checksum_mismatches)}
        return time.perf_counter() - start

    # ------------------------------------------------------------------ weight digests
    def _held(self, names: list[str]) -> str | None:
        from hybridflow.rollout.weights.digest import weights_digest

        tensors = self.engine.weight_tensors(names)
        return None if tensors is None else weights_digest(tensors, names)

    def _check_after_sync(self, module) -> None:
        """The engine must now hold the actor's weights (compared in the engine's dtype)."""
        from hybridflow.engine.reshard import distinct_state_items
        from hybridflow.rollout.weights.digest import digest_names, weights_digest

        state = dict(distinct_state_items(module))
        names = digest_names(k for k, v in state.items() if torch.is_floating_point(v))
        held_tensors = self.engine.weight_tensors(names)
        if held_tensors is None:
            self.weight_fact = {"engine": self.server.name, "when": "after a sync", "match": None,
                                "why": "the engine cannot show its weights"}
            return
        dtype = next(iter(held_tensors.values())).dtype
        expected = weights_digest(state, names, dtype=dtype)
        self._record("after the weight sync", names, self._held(names), expected)
        self._synced = (names, expected)

    def _check_after_wake(self) -> None:
        """An engine with its own copy must still hold what the last sync loaded (stale after sleep/wake)."""
        if self.shares_weights or self._synced is None:
            return
        names, expected = self._synced
        self._record("after wake_up", names, self._held(names), expected)

    def _record(self, when: str, names: list[str], held: str | None, expected: str | None) -> None:
        match = None if held is None or expected is None else held == expected
        self.weight_fact = {"engine": self.server.name, "when": when, "held": held, "expected": expected,
                            "match": match, "names": list(names)}
        if match is False:
            raise WeightMismatchError(
                f"rollout engine '{self.server.name}' does not hold the trainer's weights {when}: its weight digest "
                f"is {held}, the trainer's {expected} (over {', '.join(names)}); the rollout would generate with "
                "other weights than the ones trained (a failed or skipped load, or weights lost across sleep/wake)")

    def _sync_in_buckets(self) -> float:
        """The split actor's weights gathered a bucket at a time (``engine/reshard.py``, a collective over the
        actor's ranks); a bucket whose tensors the engine already holds is not loaded again (delta, judged per
        bucket: every rank still takes part in its gathers).  A bucket the engine refused (checksum mismatch) is
        written and loaded once more from memory, so the ranks' gathers stay in step."""
        from hybridflow.engine.reshard import reshard_in_buckets
        from hybridflow.rollout.weights.delta import ChecksumMismatch, vllm_load_group

        failed: list[BaseException] = []
        mismatches = [0]

        def load(bucket):
            if failed or not self.delta.bucket_changed(bucket):
                return
            try:
                try:
                    self.server.call(lambda: self.engine.update_weights(bucket), what="weights")
                except ChecksumMismatch:
                    mismatches[0] += 1
                    self.server.call(lambda: self.engine.update_weights(bucket), what="weights")
            except BaseException as e:  # raised after the gathers: the other ranks must not wait in one
                failed.append(e)

        # an engine serving LoRA loads the adapter (vLLM); a plain copy gets the weights with it merged (hf);
        # the tensors vLLM fuses into one parameter (q/k/v, gate/up) stay in one bucket
        lora = "adapter" if int(getattr(self.engine, "lora_rank", 0) or 0) > 0 else "merge"
        self.delta.begin()
        with self.train_engine.on_device():
            stats = reshard_in_buckets(self.train_engine.module, load, self.bucket_bytes, lora=lora,
                                       group_of=vllm_load_group,
                                       pipeline_group=self.train_engine.parallel_dims.pp_group,
                                       tied_head=self.train_engine.tied_head_weight)
        if failed:
            self.delta.forget()
            raise failed[0]
        self.delta.commit()
        self.checksum_mismatches += mismatches[0]
        self.last_sync = {**stats.update_weights_metrics(), **self.delta.stats.weight_sync_metrics(),
                          "weight_sync/checksum_mismatch": float(mismatches[0] > 0),
                          "weight_sync/checksum_mismatch_total": float(self.checksum_mismatches)}
        return stats.seconds

    def _push(self, module, full: bool) -> None:
        tensors = list(self.delta.select(module.state_dict().items(), full))
        if tensors:  # nothing changed (e.g. a LoRA run whose adapter did not move): nothing to load
            self.server.call(lambda: self.engine.update_weights(tensors), what="weights")

    def abort(self) -> None:
        self.engine.abort_all()

    def interrupt(self) -> int:
        """Close the gate and cut in-flight requests short (they continue after :meth:`resume`)."""
        return self.server.interrupt()

    def resume(self) -> None:
        self.server.resume()

    def close(self) -> None:
        self.sleep()
        self.server.close()
        shutdown = getattr(self.engine, "shutdown", None)  # engines with their own threads/processes (vLLM)
        if callable(shutdown):
            shutdown()

    def info(self) -> dict[str, Any]:
        return {"name": self.server.name, "shares_weights": self.shares_weights, "awake": self._awake is not None}
