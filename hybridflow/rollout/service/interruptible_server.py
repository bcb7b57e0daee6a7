"""A ``RolloutServer`` that can be interrupted for a weight sync and continues what it interrupted.

Partial rollout (verl's ``async_training.partial_rollout``): at a weight sync the server stops generating
at once instead of waiting for its longest request to finish.  :meth:`InterruptibleRolloutServer.interrupt`
closes the server's gate (new requests wait in front of the engine) and aborts every request in flight:
the engine returns them with ``finish_reason="abort"`` and the tokens and log-probs generated so far.  A
request that comes back aborted while the gate is closed is *continued* once :meth:`resume` reopens it --
re-submitted as prompt + tokens so far with the rest of its token budget, now sampled by the new weights
-- and its caller receives one output: all tokens, all log-probs (each token's log-prob under the weights
that generated it), the final finish reason, and ``weight_segments``: how many of its tokens each weight version
generated (the trainer dates every token by it).  Callers (agent loops, the server manager) see nothing but a
slower request, so every agent loop supports partial rollout without a special variant.

A request aborted while the gate is open (``abort_all`` on a running server) returns ``"abort"`` as usual.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.service.server import GenerateRequest, RolloutServer
from hybridflow.rollout.service.server_manager import derive_seed

__all__ = ["InterruptibleRolloutServer"]

_LOOP_CALL_S = 60.0  # closing the gate is one loop callback; a loop blocked this long is stuck


class InterruptibleRolloutServer(RolloutServer):
    """:class:`RolloutServer` with a gate: :meth:`interrupt` / :meth:`resume` (see the module docstring)."""

    def __init__(self, engine, name: str = "rollout", stall_timeout_s: float = 300.0):
        super().__init__(engine, name, stall_timeout_s)
        self._open = self._on_loop(asyncio.Event)
        self._loop.call_soon_threadsafe(self._open.set)
        self.continued = 0  # requests continued after an interruption (for tests and metrics)

    def _on_loop(self, fn):
        """Create an object on the server's loop thread (asyncio primitives belong to one loop)."""
        async def make():
            return fn()

        return asyncio.run_coroutine_threadsafe(make(), self._loop).result(_LOOP_CALL_S)

    # ------------------------------------------------------------------ control
    def interrupt(self) -> int:
        """Close the gate, then abort every request in flight; returns how many were aborted.

        Aborted requests wait at the gate and continue after :meth:`resume`.
        """
        self._check_open()
        if self.failed is not None:  # stalled: the engine cannot abort anything
            raise self.failed
        asyncio.run_coroutine_threadsafe(self._close_gate(), self._loop).result(_LOOP_CALL_S)
        return int(self.engine.abort_all() or 0)

    def resume(self) -> None:
        """Reopen the gate: waiting and interrupted requests proceed with the engine's current weights."""
        self._check_open()
        self._loop.call_soon_threadsafe(self._open.set)

    @property
    def interrupted(self) -> bool:
        return not self._open.is_set()

    def _paused(self) -> bool:  # requests waiting at the closed gate are not stalled
        gate = getattr(self, "_open", None)
        return gate is not None and not gate.is_set()

    async def _close_gate(self) -> None:
        self._open.clear()

    # ------------------------------------------------------------------ requests
    async def _generate(self, request: GenerateRequest) -> TokenOutput:
        await self._open.wait()
        output = await super()._generate(request)
        while output.finish_reason == "abort" and not self._open.is_set():
            await self._open.wait()
            output = await self._continue(request, output)
        return output

    async def _continue(self, request: GenerateRequest, done: TokenOutput) -> TokenOutput:
        params = request.sampling_params
        left = int(params.max_tokens) - len(done.token_ids)
        if left <= 0:
            return replace(done, finish_reason="length")
        seed = None if params.seed is None else derive_seed(params.seed, "continue", len(done.token_ids))
        more = await super()._generate(GenerateRequest(
            request.request_id, list(request.prompt_ids) + list(done.token_ids),
            replace(params, max_tokens=left, seed=seed), request.multi_modal_data))
        self.continued += 1
        log_probs = None
        if done.log_probs is not None and more.log_probs is not None:
            log_probs = list(done.log_probs) + list(more.log_probs)
        segments = list(done.weight_segments or [len(done.token_ids)]) + list(more.weight_segments
                                                                             or [len(more.token_ids)])
        return TokenOutput(request.request_id, list(done.token_ids) + list(more.token_ids), log_probs,
                           more.finish_reason, weight_segments=segments)
