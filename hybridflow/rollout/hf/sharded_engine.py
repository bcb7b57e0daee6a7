"""The ``hf`` engine over a model split by tensor (and expert) parallelism: one replica on ``k`` processes.

``actor_rollout_ref.rollout.tensor_model_parallel_size = k`` gives each group of ``k`` ranks one engine whose model
is split as the training plans split it (:mod:`~hybridflow.rollout.hf.shard_model`): every rank computes its
attention heads (its KV cache holds only those heads), its MLP columns, its experts and its vocabulary range, and
the layers' collectives combine them.  The group's first rank, the *leader*, serves the requests (its replica is
the one the agent loops reach); the others *follow*: before each step the leader announces the requests it admits
(:mod:`~hybridflow.rollout.hf.lockstep`), and each follower runs the same continuous batcher on them -- the same
batching, prefix reuse, chunked prefill and sampling (the logits are gathered over the vocabulary before sampling
and the generators are seeded alike, so every rank draws the same tokens).

Images are refused: the vision path of a sharded engine is not built.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time

import torch
import torch.distributed as dist

from hybridflow.engine.forward import eval_mode
from hybridflow.rollout.base import EngineError, TokenOutput
from hybridflow.rollout.hf.batcher import GenerationRequest
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.hf.lockstep import ABORT, NOOP, RESEED, SLEEP, STEP, LockstepChannel, Message

__all__ = ["ShardedHFRolloutEngine"]

logger = logging.getLogger(__name__)


def _ignore(_):
    return None


class ShardedHFRolloutEngine(HFRolloutEngine):
    """:class:`HFRolloutEngine` on one shard of a split model; ``channel`` links it to the other shards' engines.

    The leader is used like any engine (``generate``, ``generate_batch``, ``abort_all``, ``sleep``...); a follower
    only runs :meth:`follow` between its ``wake_up`` and the leader's ``sleep``.  The engine kwargs are
    :class:`HFRolloutEngine`'s; ``seed`` must be the same on every rank of the group."""

    def __init__(self, model: torch.nn.Module, tokenizer=None, *, channel: LockstepChannel, **kwargs):
        kwargs["fast_decode"] = False  # the fast step packs whole weight matrices: the split model runs its forward
        super().__init__(model, tokenizer, **kwargs)
        self.channel = channel
        self._inbox: collections.deque[GenerationRequest] = collections.deque()
        self._stop_keepalive = threading.Event()
        self._keepalive: threading.Thread | None = None
        self.keepalive_error: BaseException | None = None
        self._shard_sizing(channel.group.size)

    @property
    def is_leader(self) -> bool:
        return self.channel.group.is_leader

    def _shard_sizing(self, k: int) -> None:
        """The KV cache holds 1/k of the heads; on CUDA every rank sizes it by the group's smallest budget (each
        rank's free memory differs, and the batchers must make the same choices)."""
        batcher = self._batcher
        if batcher.geometry is not None:
            batcher.geometry = dataclasses.replace(batcher.geometry, kv_heads=max(1, batcher.geometry.kv_heads // k))
        if batcher.device.type == "cuda":
            own = batcher._budget_bytes

            def group_budget():
                value = torch.tensor([own() or 0], dtype=torch.int64)
                dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.channel._pg)
                return int(value)

            batcher._budget_bytes = group_budget

    # ------------------------------------------------------------------ leader
    def _enqueue(self, request: GenerationRequest) -> None:
        if not self.is_leader:
            raise RuntimeError(f"rollout engine '{self.name}' follows its group's leader (rank "
                               f"{self.channel.group.leader}); requests go to the leader's replica")
        if request.vision is not None:
            raise ValueError(f"request {request.request_id}: image prompts are not supported by the hf engine split "
                             "over ranks; set actor_rollout_ref.rollout.tensor_model_parallel_size=1")
        self._batcher.check(request)
        self._inbox.append(request)

    def _has_work(self) -> bool:
        return bool(self._inbox) or self._batcher.has_work()

    def _step_under_lock(self) -> None:
        new = []
        while self._inbox:
            new.append(self._inbox.popleft())
        if not new and not self._batcher.has_work():
            return
        self._batcher.pending.extend(new)  # before the send: a failed send fails them with the rest
        self.channel.send(Message(STEP, [(r.request_id, r.prompt_ids, r.params) for r in new]))
        self._batcher.step()

    def _abort_under_lock(self) -> int:
        self.channel.send(Message(ABORT))
        n = self._batcher.abort_all()
        while self._inbox:  # never announced: the followers never saw them
            req = self._inbox.popleft()
            req.on_done(TokenOutput(req.request_id, [], [] if req.params.logprobs else None, "abort"))
            n += 1
        return n

    def reseed(self, seed: int) -> None:
        with self._batcher.lock:
            self.channel.send(Message(RESEED, int(seed)))
            self.generator.manual_seed(int(seed))

    def wake_up(self) -> None:
        super().wake_up()
        if self.is_leader and self.channel.group.size > 1 and self._keepalive is None:
            self._stop_keepalive.clear()
            self._keepalive = threading.Thread(target=self._keep_alive, name="hf-rollout-keepalive", daemon=True)
            self._keepalive.start()

    def sleep(self) -> None:
        if self.is_leader:
            with self._batcher.lock:
                self._stop_keepalive.set()
                self.channel.send(Message(SLEEP, self.free_cache_engine))
            thread, self._keepalive = self._keepalive, None
            if thread is not None:
                thread.join(timeout=max(1.0, 2 * self.channel.keepalive_s))
        super().sleep()

    def _keep_alive(self) -> None:
        """Leader, while awake: a NOOP to the followers when nothing was sent for ``keepalive_s``."""
        interval = self.channel.keepalive_s
        while not self._stop_keepalive.wait(interval / 2):
            if time.monotonic() - self.channel.last_sent < interval:
                continue
            if not self._batcher.lock.acquire(timeout=0.1):  # a step under way: it sends anyway
                continue
            try:
                if not self._stop_keepalive.is_set():
                    self.channel.send(Message(NOOP))
            except BaseException as exc:  # noqa: BLE001 - the next step's send raises it to the requests
                self.keepalive_error = exc
                return
            finally:
                self._batcher.lock.release()

    def update_weights(self, named_tensors) -> int:
        raise TypeError(f"rollout engine '{self.name}' holds one shard of a split model: its weights are filled shard "
                        "by shard by engine/reshard.switch_to_rollout, not from full tensors")

    # ------------------------------------------------------------------ follower
    def follow(self) -> None:
        """Follower: apply the leader's messages to this shard's batcher until the leader sleeps."""
        if self.is_leader:
            raise RuntimeError("the leader of a rollout shard group does not follow")
        super().wake_up()
        while True:
            message = self.channel.receive()
            if message.kind == SLEEP:
                self._follower_sleep(bool(message.payload))
                return
            with self._batcher.lock:
                self._apply(message)

    def _apply(self, message: Message) -> None:
        batcher = self._batcher
        if message.kind == STEP:
            for request_id, prompt_ids, params in message.payload:
                batcher.pending.append(GenerationRequest(request_id, list(prompt_ids), params, _ignore, _ignore))
            with eval_mode(self.model):
                if batcher.has_work():
                    try:
                        batcher.step()
                    except EngineError as exc:  # the leader's step failed alike and told its requests
                        logger.warning("rollout engine '%s' (follower): a step failed: %s", self.name, exc)
        elif message.kind == ABORT:
            batcher.abort_all()
        elif message.kind == RESEED:
            self.generator.manual_seed(int(message.payload))
        elif message.kind != NOOP:
            raise ValueError(f"rollout engine '{self.name}': unknown lockstep message {message.kind!r}")

    def _follower_sleep(self, free_cache: bool) -> None:
        free, self.free_cache_engine = self.free_cache_engine, free_cache
        try:
            super().sleep()
        finally:
            self.free_cache_engine = free
