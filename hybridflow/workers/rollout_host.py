"""``RolloutHost``: the rollout engine a worker process serves, and the hybrid-engine lifecycle around it.

The actor/rollout worker owns one host.  Between generations the engine sleeps (its KV cache freed, the
FSDP shards of the shared module resharded); for a generation the controller wakes every rank up together
(``wake_up`` unshards the module once: a collective), the agent loops send requests to each rank's server
(:meth:`stream`, called from Ray's rollout thread pool, or in-process), and ``sleep`` undoes the wake-up.

``shares_weights``: the ``hf`` engine built on the actor's own module generates with whatever the last
update left in it, so :meth:`sync_weights` moves nothing and returns ``None``.  An engine with its own
copy of the weights (vLLM) gets the full, unsharded actor weights pushed into it, and the seconds spent
are returned for ``timing_s/update_weights``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Sequence

from hybridflow.engine.forward import eval_mode
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.rollout.base import RolloutEngine, TokenOutput
from hybridflow.rollout.service.replica import RolloutReplica, replica_for_server
from hybridflow.rollout.service.server import GenerateRequest, RolloutServer

__all__ = ["RolloutHost"]


class RolloutHost:
    """Serves ``engine`` from this process; ``train_engine`` holds the module the weights come from."""

    def __init__(self, engine: RolloutEngine, train_engine: TrainEngine, name: str, shares_weights: bool,
                 stream_method: str = "rollout_stream", stall_timeout_s: float = 300.0):
        self.engine = engine
        self.train_engine = train_engine
        self.shares_weights = shares_weights
        self.stream_method = stream_method
        self.server = RolloutServer(engine, name=name, stall_timeout_s=stall_timeout_s)
        self._awake: contextlib.ExitStack | None = None

    # ------------------------------------------------------------------ data plane
    def replica(self, host_role: str | None) -> RolloutReplica:
        return replica_for_server(self.server, self.stream_method, host_role)

    def stream(self, requests: Sequence[GenerateRequest]) -> Iterator[list[tuple[int, TokenOutput | BaseException]]]:
        if self._awake is None:
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
            self.server.call(self.engine.wake_up, what="wake_up")
            if seed is not None:
                self.server.call(lambda: self.engine.reseed(seed), what="reseed")
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
        """Push the actor's latest weights into an engine with its own copy; ``None`` when shared."""
        if self.shares_weights:
            return None
        start = time.perf_counter()
        with self.train_engine.full_params() as module:
            tensors = list(module.state_dict().items())
            self.server.call(lambda: self.engine.update_weights(tensors), what="weights")
        return time.perf_counter() - start

    def abort(self) -> None:
        self.engine.abort_all()

    def close(self) -> None:
        self.sleep()
        self.server.close()
        shutdown = getattr(self.engine, "shutdown", None)  # engines with their own threads/processes (vLLM)
        if callable(shutdown):
            shutdown()

    def info(self) -> dict[str, Any]:
        return {"name": self.server.name, "shares_weights": self.shares_weights, "awake": self._awake is not None}
