"""What one weight transfer moved: the one record of the reshard, the checkpoint engine and the delta tracker.

Three paths move the actor's weights towards a rollout engine, and each counts what it moved in a
:class:`TransferStats`:

* the bucketed gather from the training layout (``engine/reshard.py``): every tensor is gathered, so ``tensors``
  and ``bytes`` equal their totals; it also fills ``buckets``, ``max_bucket_bytes`` and ``peak_rss_rise_bytes``;
* the checkpoint engine's broadcast to standalone replicas (``rollout/weights/checkpoint_engine.py``): what went
  over the wire, ``buckets`` and ``seconds``;
* the delta tracker (``rollout/weights/delta.py``): ``*_total`` is what a full sync would send, ``tensors`` /
  ``bytes`` what this one sends; the difference is ``skipped`` / ``skipped_bytes``.

Two sets of metric names are logged from it, as they always were: :meth:`TransferStats.update_weights_metrics`
(``update_weights/{tensors,bytes,buckets,max_bucket_bytes,peak_rss_rise_bytes}``, the transition) and
:meth:`TransferStats.weight_sync_metrics` (``weight_sync/{bytes_sent,bytes_total,tensors_sent,skipped,
skipped_bytes}``, the delta).  The seconds are the trainer's ``timing_s/update_weights``, not a metric of either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

__all__ = ["TransferStats"]

_UPDATE_WEIGHTS_KEYS = ("tensors", "bytes", "buckets", "max_bucket_bytes", "peak_rss_rise_bytes")


@dataclass
class TransferStats:
    tensors: int = 0  # tensors moved
    bytes: int = 0  # bytes moved
    tensors_total: int = 0  # tensors a full transfer moves (a delta sync leaves the unchanged ones out)
    bytes_total: int = 0
    buckets: int = 0
    received_bytes: int = 0  # bytes that arrived from other ranks (the switch to a sharded rollout)
    max_bucket_bytes: int = 0
    seconds: float = 0.0
    peak_rss_rise_bytes: int | None = None  # rise of the process's peak resident memory (Linux), when measured
    peak_rss_bytes: int | None = None  # the process's peak resident memory during the transfer (Linux)
    peak_device_bytes: int | None = None  # CUDA: the device's peak allocation during the transfer

    @property
    def skipped(self) -> int:
        """Tensors a full transfer would have moved and this one did not."""
        return self.tensors_total - self.tensors

    @property
    def skipped_bytes(self) -> int:
        return self.bytes_total - self.bytes

    def count(self, tensors: int, nbytes: int, moved: bool = True) -> None:
        """Add ``tensors`` tensors of ``nbytes`` bytes to the totals, and to what moved when ``moved``."""
        self.tensors_total += tensors
        self.bytes_total += nbytes
        if moved:
            self.tensors += tensors
            self.bytes += nbytes

    def update_weights_metrics(self, prefix: str = "update_weights") -> dict[str, float]:
        """``update_weights/{tensors,bytes,buckets,max_bucket_bytes,peak_rss_rise_bytes}`` (the last when measured)."""
        values = asdict(self)
        return {f"{prefix}/{k}": float(values[k]) for k in _UPDATE_WEIGHTS_KEYS if values[k] is not None}

    def memory_metrics(self) -> dict[str, float]:
        """``perf/max_memory_{rss,allocated}_update_weights_gb``: the peak memory of the process (resident) and of the
        device (CUDA) while the weights moved, where measured."""
        gib = float(1 << 30)
        out = {}
        if self.peak_rss_bytes is not None:
            out["perf/max_memory_rss_update_weights_gb"] = self.peak_rss_bytes / gib
        if self.peak_device_bytes is not None:
            out["perf/max_memory_allocated_update_weights_gb"] = self.peak_device_bytes / gib
        return out

    def weight_sync_metrics(self) -> dict[str, float]:
        """``weight_sync/{bytes_sent,bytes_total,tensors_sent,skipped,skipped_bytes}`` of a (delta) sync."""
        return {"weight_sync/bytes_sent": float(self.bytes), "weight_sync/bytes_total": float(self.bytes_total),
                "weight_sync/tensors_sent": float(self.tensors), "weight_sync/skipped": float(self.skipped),
                "weight_sync/skipped_bytes": float(self.skipped_bytes)}

    def as_floats(self) -> dict[str, float]:
        """Every measured field as a float (what a worker returns over Ray); :meth:`from_floats` reads it back."""
        return {k: float(v) for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_floats(cls, values: Mapping[str, Any]) -> TransferStats:
        known = {f.name: f.type for f in fields(cls)}
        return cls(**{k: (float(v) if k == "seconds" else int(v)) for k, v in values.items() if k in known})
