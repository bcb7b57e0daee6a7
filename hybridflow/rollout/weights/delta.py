"""Delta weight sync: after an update only the tensors whose bytes changed travel, and every payload is checked.

The sender keeps, per tensor name, a 16-byte digest of the bytes the rollout holds (:class:`DeltaTracker`).  At a
sync it digests the actor's tensors and passes on only those whose digest differs -- a frozen vision tower, an
embedding no gradient reached, a LoRA run's base weights (never sent: the adapter is the model's only trained
part), a step the critic warm-up left the actor unchanged: all skipped.  The digests become the rollout's only when
the sync was verified (:meth:`DeltaTracker.commit`); until then the next sync compares against the old ones.

Every payload carries a checksum of its bytes (:func:`digest` of a bucket, of a safetensors file); the receiver
recomputes it and refuses a payload that does not match.  The sync then fails as a whole, the sender sends
everything again (``full=True``: nothing skipped), and ``weight_sync/checksum_mismatch`` counts it.

Digests: on CPU BLAKE2b-128 of the bytes (a changed tensor keeps its digest with probability 2^-128); on CUDA two
64-bit sums over the tensor's 32-bit words (plain and position-weighted, computed on the device with one host
sync), which change with any single changed word.

Metrics of a sync (``weight_sync/*``, counted in :attr:`DeltaTracker.stats`, a
:class:`~hybridflow.engine.transfer_stats.TransferStats`): ``bytes_sent``, ``bytes_total`` (what a full sync sends),
``tensors_sent``, ``skipped`` (tensors not sent), ``skipped_bytes``; the fleets add ``checksum_mismatch`` (1 when the
sync had to be resent).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable, Iterator

import torch

from hybridflow.engine.transfer_stats import TransferStats

__all__ = ["digest", "DeltaTracker", "ChecksumMismatch", "vllm_load_group", "lora_group", "hex_digests"]


class ChecksumMismatch(RuntimeError):
    """A weight payload arrived with other bytes than the sender checksummed (it was not applied)."""


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    t = tensor.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)


def digest(tensor: torch.Tensor) -> bytes:
    """16 bytes that change when ``tensor``'s bytes (or dtype, or shape) do."""
    raw = _as_bytes(tensor)
    head = f"{tensor.dtype}{tuple(tensor.shape)}".encode()
    if raw.device.type == "cpu":
        h = hashlib.blake2b(head, digest_size=16)
        if raw.numel():
            h.update(raw.numpy())
        return h.digest()
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32).to(torch.int64)
    weights = torch.arange(1, words.numel() + 1, device=words.device, dtype=torch.int64)
    plain, weighted = torch.stack([words.sum(), (words * weights).sum()]).tolist()
    return hashlib.blake2b(head + plain.to_bytes(8, "little", signed=True) + weighted.to_bytes(8, "little", signed=True),
                           digest_size=16).digest()


def vllm_load_group(name: str) -> str:
    """The unit vLLM reloads together: tensors that may be fused into one vLLM parameter (q/k/v into qkv_proj,
    gate/up into gate_up_proj, an MoE layer's experts) live under the same module two levels up
    (``model.layers.3.self_attn.q_proj.weight`` -> ``model.layers.3.self_attn``); a partial reload of such a
    parameter would leave its other parts undefined, so a group travels whole when any of it changed."""
    parts = name.split(".")
    return ".".join(parts[:-2]) if len(parts) > 2 else name


def lora_group(name: str) -> str | None:
    """LoRA: the adapter loads as one folder (all of it, or nothing); the frozen base never travels."""
    return "adapter" if (".lora_A." in name or ".lora_B." in name) else None


class DeltaTracker:
    """The sender's record of what the receivers hold (see the module docstring).

    ``group_of(name)``: tensors of one group travel together (any changed: all sent); ``None`` for a name
    means it never travels.  Default: every tensor is its own group.
    """

    def __init__(self, enabled: bool = True, group_of: Callable[[str], str | None] | None = None):
        self.enabled = bool(enabled)
        self.group_of = group_of
        self.held: dict[str, bytes] = {}
        self._pending: dict[str, bytes] = {}
        self.stats = TransferStats()

    def select(self, named_tensors: Iterable[tuple[str, torch.Tensor]], full: bool = False
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors to send (all of them with ``full`` or when delta is off); counts into :attr:`stats`."""
        self._pending, self.stats = {}, TransferStats()
        if self.group_of is not None:
            yield from self._select_groups(named_tensors, full)
            return
        for name, tensor in named_tensors:
            nbytes = tensor.numel() * tensor.element_size()
            d = digest(tensor) if self.enabled else b""
            unchanged = self.enabled and not full and self.held.get(name) == d
            self.stats.count(1, nbytes, moved=not unchanged)
            if unchanged:
                continue
            self._pending[name] = d
            yield name, tensor

    def _select_groups(self, named_tensors, full: bool) -> Iterator[tuple[str, torch.Tensor]]:
        groups: dict[str, list[tuple[str, torch.Tensor, bytes]]] = {}
        for name, tensor in named_tensors:
            key = self.group_of(name)
            if key is None:
                continue
            groups.setdefault(key, []).append((name, tensor, digest(tensor) if self.enabled else b""))
        for members in groups.values():
            nbytes = sum(t.numel() * t.element_size() for _, t, _ in members)
            unchanged = self.enabled and not full and all(self.held.get(n) == d for n, _, d in members)
            self.stats.count(len(members), nbytes, moved=not unchanged)
            if unchanged:
                continue
            for name, tensor, d in members:
                self._pending[name] = d
                yield name, tensor

    def begin(self) -> None:
        """Start a sync that is judged bucket by bucket (:meth:`bucket_changed`)."""
        self._pending, self.stats = {}, TransferStats()

    def bucket_changed(self, bucket: list[tuple[str, torch.Tensor]], full: bool = False) -> bool:
        """Whether ``bucket`` must travel: any of its tensors differs from what the receivers hold (all of them
        with ``full`` or delta off).  A bucket travels whole, so the groups it keeps together (fused vLLM
        parameters) stay whole; counts into :attr:`stats`."""
        digests = {name: digest(t) if self.enabled else b"" for name, t in bucket}
        nbytes = sum(t.numel() * t.element_size() for _, t in bucket)
        unchanged = self.enabled and not full and all(self.held.get(n) == d for n, d in digests.items())
        self.stats.count(len(bucket), nbytes, moved=not unchanged)
        if unchanged:
            return False
        self._pending.update(digests)
        return True

    def commit(self) -> None:
        """The receivers verified the last sync: they hold what was sent."""
        if self.enabled:
            self.held.update(self._pending)
        self._pending = {}

    def forget(self) -> None:
        """The receivers' state is unknown (a failed sync): the next one compares against nothing."""
        self.held.clear()
        self._pending = {}


def hex_digests(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """``{name: digest as hex}``: the checksums a file-based receiver verifies."""
    return {name: digest(t).hex() for name, t in named_tensors}
