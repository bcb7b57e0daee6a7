"""The checkpoint engine: moves the actor's full weights from the trainer to standalone rollout replicas.

verl's name for the one small abstraction behind every trainer -> rollout weight sync::

    engine.send_weights(named_tensors)      # on the sender (the actor's rank 0), blocking until delivered
    for bucket in engine.receive_buckets(): # on every receiver (a rollout replica), in the same order
        rollout_engine.update_weights(bucket)

:class:`BroadcastCheckpointEngine` packs the tensors into buckets of ``bucket_bytes`` (verl's
``update_weights_bucket_megabytes`` / ``device_buffer_size_M``; 0 sends one tensor per broadcast) and
broadcasts each bucket from rank 0 over a process group of its own -- gloo on CPU, NCCL on GPU -- built
directly on a ``TCPStore``, so it never touches a process's default ``torch.distributed`` world (the actor's
FSDP group).  Members may be processes or threads of one process (the local backend).  Receivers get views
into the bucket buffer and must copy them before asking for the next bucket, which is what every engine's
``update_weights`` does; at most one bucket (two with ``overlap``) is in memory on either side.

With ``overlap`` the broadcast of bucket k+1 runs while the receiver copies bucket k into its model
(verl's ``overlap_broadcast_and_consume``), at the cost of a second buffer.

A member that fails half-way (its weights iterator raises, a bucket does not load into the engine) calls
:meth:`CheckpointEngine.abort`: it leaves the group at once, which closes its connections, so the other
members' transfers fail within a fraction of a second ("Connection closed by peer") instead of waiting out
``timeout_s``; the failing member's own error is the one to report.

Engines that load weights from files instead (a vLLM server replica reloads a safetensors folder) are fed by
a receiver that writes the received buckets to that folder; the sender side does not change.

Delta sync (:mod:`hybridflow.rollout.weights.delta`): given a :class:`DeltaTracker`, :meth:`send_weights` sends
only the tensors whose bytes changed since the last verified sync, and every bucket carries a checksum of its
bytes.  A receiver recomputes it, never yields a bucket that does not match, and counts it in
:attr:`BroadcastCheckpointEngine.corrupt_buckets`; the fleet then has everything sent again.
"""

from __future__ import annotations

import datetime
import pickle
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from hybridflow.engine.transfer_stats import TransferStats
from hybridflow.rollout.weights.delta import DeltaTracker, digest
from hybridflow.utils.rendezvous_bind import free_port as _free_port
from hybridflow.utils.rendezvous_bind import rendezvous_host, tcp_store

__all__ = ["WeightSyncSpec", "CheckpointEngine", "BroadcastCheckpointEngine", "resolve_backend",
           "free_port", "node_address", "full_tensors"]

NamedTensors = Iterable[tuple[str, torch.Tensor]]
Bucket = list[tuple[str, torch.Tensor]]
_ALIGN = 64  # byte offset of every tensor in a bucket (dtype views need aligned storage)


@dataclass(frozen=True)
class WeightSyncSpec:
    """Where the members of one weight-sync group meet; the same (picklable) object goes to every member.

    Rank 0 is the sender; ranks ``1..world_size-1`` are the replicas.  ``bucket_bytes=0`` sends one tensor
    per broadcast.
    """

    backend: str
    master_addr: str
    master_port: int
    world_size: int
    bucket_bytes: int
    overlap: bool = False
    timeout_s: float = 600.0
    delta: bool = True  # send only the tensors that changed since the last verified sync


def resolve_backend(name: str, device_type: str) -> str:
    """``rollout.checkpoint_engine.backend`` -> the torch.distributed backend (naive: gloo on CPU, NCCL on GPU)."""
    if name == "naive":
        return "nccl" if device_type == "cuda" else "gloo"
    if name == "nccl" and device_type != "cuda":
        raise ValueError("actor_rollout_ref.rollout.checkpoint_engine.backend=nccl needs CUDA devices; use gloo "
                         "(or naive) on CPU")
    if name not in ("gloo", "nccl"):
        raise ValueError(f"actor_rollout_ref.rollout.checkpoint_engine.backend={name!r}: use naive, gloo or nccl")
    return name


def node_address() -> str:
    """Where this group's rank 0 listens: the loopback on one machine, the node IP in a multi-node Ray cluster."""
    return rendezvous_host()


def free_port() -> int:
    return _free_port(rendezvous_host())


def full_tensors(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's state dict as full tensors (an FSDP2 ``DTensor`` is gathered: a collective, so every rank
    of the module's group must iterate too).  A tensor shared under two names (tied embeddings) comes once."""
    from hybridflow.engine.reshard import distinct_state_items

    for name, tensor in distinct_state_items(module):
        yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach()


class CheckpointEngine(ABC):
    """One sender, many receivers, the same sequence of buckets."""

    @abstractmethod
    def send_weights(self, named_tensors: NamedTensors, delta: DeltaTracker | None = None,
                     full: bool = False) -> TransferStats:
        """Deliver every tensor to every receiver (rank 0 only) -- with ``delta``, every tensor that changed since
        the last verified sync (``full``: every tensor regardless); returns what was sent."""

    @abstractmethod
    def receive_buckets(self) -> Iterator[Bucket]:
        """The sender's tensors, a bucket at a time (ranks > 0); copy each bucket before asking for the next."""

    def receive_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in self.receive_buckets():
            yield from bucket

    def close(self) -> None:
        """Leave the group."""

    def abort(self, reason: BaseException | str = "a member failed") -> None:
        """Leave the group after a failure, so that the other members fail now rather than at their timeout;
        later transfers through this engine raise."""
        self.close()


class BroadcastCheckpointEngine(CheckpointEngine):
    """Bucketed ``broadcast`` from rank 0 over a private gloo / NCCL group (see the module docstring)."""

    def __init__(self, spec: WeightSyncSpec, rank: int, device: torch.device | str | None = None):
        if not 0 <= rank < spec.world_size:
            raise ValueError(f"rank {rank} is outside the weight-sync group of {spec.world_size}")
        self.spec = spec
        self.rank = rank
        self.device = torch.device(device if device is not None else ("cuda" if spec.backend == "nccl" else "cpu"))
        self._store = None
        self._group = None
        self._buffers: list[torch.Tensor | None] = [None, None]
        self.corrupt_buckets = 0  # receiver: buckets of the last receive whose checksum did not match
        self._aborted: str | None = None

    # ------------------------------------------------------------------ group
    def connect(self) -> "BroadcastCheckpointEngine":
        """Join the group (blocks until every member has joined); idempotent."""
        if self._aborted is not None:
            raise RuntimeError(f"weight-sync rank {self.rank} left its group after a failure ({self._aborted}); "
                               "the group must be rebuilt (a new WeightSyncSpec) before the next transfer")
        if self._group is not None:
            return self
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=float(self.spec.timeout_s))
        self._store = tcp_store(self.spec.master_addr, int(self.spec.master_port), self.spec.world_size,
                                is_master=self.rank == 0, timeout=timeout)  # listens on master_addr only
        if self.spec.backend == "gloo":
            self._group = dist.ProcessGroupGloo(self._store, self.rank, self.spec.world_size, timeout)
        elif self.spec.backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = dist.ProcessGroupNCCL(self._store, self.rank, self.spec.world_size, options)
        else:
            raise ValueError(f"weight-sync backend must be gloo or nccl, got {self.spec.backend!r}")
        return self

    def close(self) -> None:
        self._group = None  # the last reference: its connections close now
        self._store = None
        self._buffers = [None, None]

    def abort(self, reason: BaseException | str = "a member failed") -> None:
        self._aborted = f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
        self.close()

    def _broadcast(self, tensor: torch.Tensor, wait: bool = True):
        import torch.distributed as dist

        options = dist.BroadcastOptions()
        options.rootRank = 0
        work = self.connect()._group.broadcast([tensor], options)
        if wait:
            work.wait()
            return None
        return work

    def _buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        buf = self._buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = self._buffers[slot] = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=self.device)
        return buf

    # ------------------------------------------------------------------ headers: [meta bytes, data bytes, more]
    def _send_meta(self, meta: dict | None, nbytes: int) -> None:
        payload = pickle.dumps(meta) if meta is not None else b""
        header = torch.tensor([len(payload), nbytes, int(meta is not None)], dtype=torch.int64, device=self.device)
        self._broadcast(header)
        if payload:
            self._broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device))

    def _recv_meta(self) -> tuple[dict, int] | None:
        header = torch.zeros(3, dtype=torch.int64, device=self.device)
        self._broadcast(header)
        meta_len, nbytes, more = (int(v) for v in header.tolist())
        if not more:
            return None
        payload = torch.empty(meta_len, dtype=torch.uint8, device=self.device)
        self._broadcast(payload)
        return pickle.loads(payload.cpu().numpy().tobytes()), nbytes

    # ------------------------------------------------------------------ sender
    def _plan(self, named_tensors: NamedTensors) -> Iterator[list[tuple[str, torch.Tensor, int]]]:
        """Group tensors into buckets of at most ``bucket_bytes`` (a larger tensor gets a bucket of its own)."""
        limit = int(self.spec.bucket_bytes)
        bucket: list[tuple[str, torch.Tensor, int]] = []
        offset = 0
        for name, tensor in named_tensors:
            tensor = tensor.detach().contiguous()
            nbytes = tensor.numel() * tensor.element_size()
            start = -(-offset // _ALIGN) * _ALIGN
            if bucket and (limit <= 0 or start + nbytes > limit):
                yield bucket
                bucket, start = [], 0
            bucket.append((name, tensor, start))
            offset = start + nbytes
        if bucket:
            yield bucket

    def send_weights(self, named_tensors: NamedTensors, delta: DeltaTracker | None = None,
                     full: bool = False) -> TransferStats:
        if self.rank != 0:
            raise RuntimeError("only rank 0 of a weight-sync group sends")
        try:
            return self._send(named_tensors, delta, full)
        except BaseException as exc:  # the receivers must not wait for buckets that will never come
            self.abort(exc)
            raise

    def _send(self, named_tensors: NamedTensors, delta: DeltaTracker | None, full: bool) -> TransferStats:
        start_time = time.perf_counter()
        stats = TransferStats()
        if delta is not None:
            named_tensors = delta.select(named_tensors, full)
        pending: list = [None, None]
        slot = 0
        for bucket in self._plan(named_tensors):
            last = bucket[-1]
            nbytes = last[2] + last[1].numel() * last[1].element_size()
            if pending[slot] is not None:  # the buffer is still on the wire (overlap): wait before refilling it
                pending[slot].wait()
                pending[slot] = None
            buf = self._buffer(slot, nbytes)
            entries = []
            for name, tensor, offset in bucket:
                size = tensor.numel() * tensor.element_size()
                buf[offset:offset + size].copy_(tensor.reshape(-1).view(torch.uint8), non_blocking=True)
                entries.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), offset, size))
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            self._send_meta({"tensors": entries, "checksum": digest(buf[:nbytes])}, nbytes)
            work = self._broadcast(buf[:nbytes], wait=not self.spec.overlap)
            if work is not None:
                pending[slot] = work
                slot ^= 1
            stats.count(len(bucket), sum(t.numel() * t.element_size() for _, t, _ in bucket))
            stats.buckets += 1
        for work in pending:
            if work is not None:
                work.wait()
        self._send_meta(None, 0)
        stats.seconds = time.perf_counter() - start_time
        if delta is not None:  # what a full sync would have sent, the unchanged tensors included
            stats.tensors_total, stats.bytes_total = delta.stats.tensors_total, delta.stats.bytes_total
        return stats

    # ------------------------------------------------------------------ receivers
    def _post(self, nbytes: int, slot: int):
        buf = self._buffer(slot, nbytes)[:nbytes]
        return buf, self._broadcast(buf, wait=False)

    @staticmethod
    def _unpack(meta: dict, buf: torch.Tensor) -> Bucket:
        out = []
        for name, dtype, shape, offset, size in meta["tensors"]:
            out.append((name, buf[offset:offset + size].view(getattr(torch, dtype)).view(shape)))
        return out

    def _verified(self, meta: dict, buf: torch.Tensor) -> Bucket | None:
        """The bucket's tensors, or ``None`` (counted) when its bytes are not the ones the sender checksummed."""
        if digest(buf) != meta["checksum"]:
            self.corrupt_buckets += 1
            return None
        return self._unpack(meta, buf)

    def receive_buckets(self) -> Iterator[Bucket]:
        """The buckets whose checksum matched (:attr:`corrupt_buckets` counts the others, which are skipped)."""
        if self.rank == 0:
            raise RuntimeError("rank 0 of a weight-sync group is the sender")
        self.corrupt_buckets = 0
        try:
            yield from self._receive()
        except BaseException as exc:  # a transfer error, or the consumer gave up (GeneratorExit): leave now
            self.abort(exc if not isinstance(exc, GeneratorExit) else "the receiver stopped half-way")
            raise

    def _receive(self) -> Iterator[Bucket]:
        head = self._recv_meta()
        if head is None:
            return
        slot = 0
        meta, nbytes = head
        buf, work = self._post(nbytes, slot)
        while True:
            work.wait()
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()
            current = self._verified(meta, buf)
            if self.spec.overlap:  # start the next bucket's transfer before the caller copies this one
                head = self._recv_meta()
                if head is not None:
                    slot ^= 1
                    meta, nbytes = head
                    buf, work = self._post(nbytes, slot)
                if current is not None:
                    yield current
                if head is None:
                    return
            else:
                if current is not None:
                    yield current
                head = self._recv_meta()
                if head is None:
                    return
                meta, nbytes = head
                buf, work = self._post(nbytes, slot)
