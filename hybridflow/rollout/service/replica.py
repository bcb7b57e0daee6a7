"""Rollout replicas: client-side handles that send token-in/token-out requests to one served engine.

A *replica* is one engine instance (with its own KV cache) that agent loops reach through the
``AsyncLLMServerManager``.  The manager only needs :meth:`RolloutReplica.generate` and a ``name``; where
the engine runs is the replica class's business:

* :class:`InProcessReplica` -- the engine's :class:`~hybridflow.rollout.service.server.RolloutServer` lives in this
  process (``trainer.backend=local``: one process, breakpoints work everywhere);
* :class:`RayActorReplica` -- the server lives in a Ray actor: a rank of the hybrid actor/rollout worker
  group, or a standalone server actor.  The handle pickles, so agent-loop worker actors can hold it.

Requests to a Ray replica are *coalesced*: everything an event loop submits before it next goes idle
travels in one Ray streaming call, and the outputs come back as they finish (one Ray call per request
costs about 1 ms of CPU on both ends; a streamed batch costs about a third of that per request).  A turn
that finishes early is delivered at once, so continuous batching across turns is kept.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from abc import ABC, abstractmethod
from typing import Any

from hybridflow.controller.node_loss import lost_node_note
from hybridflow.rollout.base import EngineError, TokenOutput
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.rollout.service.server import GenerateRequest, RolloutServer
from hybridflow.utils.threads import LoopPoster

__all__ = ["RolloutReplica", "InProcessReplica", "RayActorReplica", "ReplicaError", "replica_for_server",
           "RAY_ROLLOUT_CONCURRENCY_GROUP"]

# Ray concurrency group that rollout requests run in, so they never queue behind the worker's own methods.
RAY_ROLLOUT_CONCURRENCY_GROUP = "rollout"


class ReplicaError(EngineError):
    """A replica could not serve a request (its process died, or the transport failed); names the replica."""


class RolloutReplica(ABC):
    """Where requests for one engine instance go.  ``name`` identifies it in metrics and errors."""

    name: str

    @abstractmethod
    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams,
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        """One response for ``prompt_ids`` (``sampling_params.n == 1``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class _TickBatching(RolloutReplica):
    """Requests an event loop makes before it next goes idle travel together (see the module docstring):
    subclasses implement :meth:`_send` for one such batch and resolve its futures."""

    def _reset_batching(self) -> None:
        # one pending batch per event loop: a replica is shared by every agent-loop manager of the process (the
        # async rollouter's loop and validation's run at the same time), and a future may only be completed on
        # its own loop
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[GenerateRequest, asyncio.Future]]] = {}

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None) -> TokenOutput:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        batch = self._pending.get(loop)
        if batch is None:
            batch = self._pending[loop] = []
            loop.call_soon(self._flush, loop)
        batch.append((GenerateRequest(request_id, list(prompt_ids), sampling_params, multi_modal_data), future))
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._pending.pop(loop, [])
        if batch:
            loop.create_task(self._send(batch))

    async def _send(self, batch: list[tuple[GenerateRequest, asyncio.Future]]) -> None:
        raise NotImplementedError


class InProcessReplica(_TickBatching):
    """A server in this process.  A request made on the server's own loop (the local backend's agent loops run
    there: :meth:`RolloutServer.run`) goes straight to the engine; from any other loop it crosses threads, the
    requests of one tick together."""

    def __init__(self, server: RolloutServer, name: str | None = None):
        self.server = server
        self.name = name or server.name
        self._reset_batching()

    async def generate(self, request_id, prompt_ids, sampling_params, multi_modal_data=None) -> TokenOutput:
        if asyncio.get_running_loop() is self.server.loop:
            return await self.server.serve(GenerateRequest(request_id, list(prompt_ids), sampling_params,
                                                           multi_modal_data))
        return await super().generate(request_id, prompt_ids, sampling_params, multi_modal_data)

    async def _send(self, batch) -> None:
        try:
            futures = self.server.submit_many([r for r, _ in batch])
        except Exception as exc:  # noqa: BLE001 - a closed server: every waiter learns it
            error = ReplicaError(f"rollout replica '{self.name}' refused the requests: {type(exc).__name__}: {exc}")
            for _, waiter in batch:
                if not waiter.done():
                    waiter.set_exception(error)
            return
        # results come back through one poster per batch: the requests an engine step finishes together wake
        # this loop once (no task, wrapped future and self-pipe write per request)
        poster = LoopPoster(asyncio.get_running_loop())
        for (_, waiter), future in zip(batch, futures):
            future.add_done_callback(lambda f, w=waiter: poster.post(lambda: _relay(f, w)))
            waiter.add_done_callback(lambda w, f=future: f.cancel() if w.cancelled() else None)  # a cancelled trajectory


def _relay(source: concurrent.futures.Future, target: asyncio.Future) -> None:
    if target.done():  # the trajectory was cancelled meanwhile
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:  # handed to the waiting trajectory
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())


class RayActorReplica(_TickBatching):
    """A server inside a Ray actor, reached through the actor's generator method ``method``.

    ``method(requests: list[GenerateRequest])`` must yield lists of ``(index, TokenOutput | exception)``
    (what :meth:`RolloutServer.stream` yields).  With ``host_role`` the actor is a colocated host and the
    call goes through its ``stream_role(host_role, method, ...)``.  The actor class must declare the
    :data:`RAY_ROLLOUT_CONCURRENCY_GROUP` concurrency group.
    """

    def __init__(self, actor: Any, method: str, name: str, host_role: str | None = None):
        self.actor = actor
        self.method = method
        self.name = name
        self.host_role = host_role
        self._reset_batching()

    def __getstate__(self) -> dict[str, Any]:
        return {"actor": self.actor, "method": self.method, "name": self.name, "host_role": self.host_role}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_batching()

    def _stream_call(self, requests: list[GenerateRequest]):
        options = {"concurrency_group": RAY_ROLLOUT_CONCURRENCY_GROUP, "num_returns": "streaming"}
        if self.host_role is None:
            return getattr(self.actor, self.method).options(**options).remote(requests)
        return self.actor.stream_role.options(**options).remote(self.host_role, self.method, requests)

    async def _send(self, batch: list[tuple[GenerateRequest, asyncio.Future]]) -> None:
        futures = [f for _, f in batch]
        try:
            async for ref in self._stream_call([r for r, _ in batch]):
                for index, output in await ref:
                    target = futures[index]
                    if target.done():
                        continue
                    if isinstance(output, BaseException):
                        target.set_exception(output)
                    else:
                        target.set_result(output)
        except Exception as exc:  # noqa: BLE001 - the replica or the transport failed: every waiter learns it
            cause = f"{type(exc).__name__}: {exc}"
            lost = await asyncio.to_thread(lost_node_note, exc)  # its whole node gone? (a bounded TCP knock)
            error = ReplicaError(f"rollout replica '{self.name}' failed: "
                                 + (f"{lost}. Cause reported by Ray: {cause}" if lost else cause))
            for f in futures:
                if not f.done():
                    f.set_exception(error)
            return
        for f in futures:
            if not f.done():
                f.set_exception(ReplicaError(f"rollout replica '{self.name}' ended a stream without an answer"))


def replica_for_server(server: RolloutServer, method: str, host_role: str | None = None) -> RolloutReplica:
    """The handle other processes should use to reach ``server``, which lives in *this* process.

    Inside a Ray actor: a :class:`RayActorReplica` on the current actor's ``method`` (the caller's generator
    method wrapping ``server.stream``); elsewhere (local backend): an :class:`InProcessReplica`.
    """
    ray = sys.modules.get("ray")  # not imported (local backend, or no Ray installed): necessarily in-process
    if ray is None:
        return InProcessReplica(server)
    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        actor = ray.get_runtime_context().current_actor
        return RayActorReplica(actor, method, server.name, host_role)
    return InProcessReplica(server)
