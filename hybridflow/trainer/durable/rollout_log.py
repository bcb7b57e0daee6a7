"""The rollout log: generated-but-untrained samples of one run, durable from the moment they exist until a
checkpoint covers them (``trainer.rollout_wal``).

The async and V1 modes generate ahead of training; a checkpoint records which samples were trained, so without
this log a crash loses everything generated since (and the partial rollouts in flight): the resumed run
generates it again. The log (``<trainer.default_local_dir>/rollout_wal/<mode>.log``, one
:class:`~hybridflow.trainer.durable.wal.WriteAheadLog`) holds, each record fsync'd before the run goes on:

* ``sample``  a finished sample of the streaming modes (prompt row, trajectories' tokens, log-probs and the weight
  versions that generated them), written when it finishes, before the trainer can take it;
* ``batch``   one-step-off's batch generated ahead for step ``step`` (and how many loader batches it used);
* ``taken``   which samples trainer step ``step`` (mini-batch ``index``) trains, written when it takes them;
* ``evicted`` V1: groups the replay buffer dropped at step ``step``.

A checkpoint of step ``s`` covers the samples it records as done and the steps up to ``s``: once it is complete
the log is rewritten without them (:meth:`RolloutLog.covered`). On resume from step ``s``
(:meth:`RolloutLog.restore`) the samples not covered come back as finished samples, and the steps after ``s``
that the crashed run had taken are replayed with exactly the samples they took, so the weight versions line up
and nothing is trained twice or generated twice. The log is bounded by ``trainer.rollout_wal.max_mb``: a sample
that would pass it is not written (``rollout_wal/unlogged_samples``) and is generated again after a crash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hybridflow.trainer.asynchronous.sample_queue import Sample
from hybridflow.trainer.durable.codec import Unencodable, decode, decode_sample, encode, encode_sample
from hybridflow.trainer.durable.group_commit import GroupCommit
from hybridflow.trainer.durable.wal import WriteAheadLog

__all__ = ["Restored", "RolloutLog", "fingerprint", "sample_digest"]

_LOG = logging.getLogger(__name__)
FORMAT = 1


def fingerprint(config, mode: str) -> str:
    """What must match for a log to belong to this run: the mode, the data, the batch shape, the model, the seed."""
    d, r, t = config.data, config.actor_rollout_ref.rollout, config.trainer
    keys = [mode, str(d.train_files), d.train_batch_size, d.max_prompt_length, d.max_response_length, r.n,
            str(config.actor_rollout_ref.model.path), t.seed, str(config.async_training), str(t.v1)]
    return hashlib.sha256(json.dumps(keys, default=str).encode()).hexdigest()[:16]


def sample_digest(outputs: list[Any]) -> str:
    """A short digest of a sample's response tokens (what a trained-samples record compares)."""
    h = hashlib.sha256()
    for o in outputs:
        h.update(json.dumps(list(getattr(o, "response_ids", o))).encode())
    return h.hexdigest()[:12]


@dataclass
class Restored:
    """What a resume gets back: finished samples, the steps to replay, one-step-off's batches."""

    samples: dict[int, Sample] = field(default_factory=dict)
    replay: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (step, index) -> ordinals, in order
    evicted: list[int] = field(default_factory=list)
    batches: dict[int, tuple[Any, int]] = field(default_factory=dict)  # step -> (DataProto, loader batches used)


class RolloutLog:
    """One run's log (see the module docstring). ``None`` from :meth:`open` when the run keeps none."""

    def __init__(self, path: Path, max_bytes: int, fp: str, mode: str):
        self.wal = WriteAheadLog(path, max_bytes)
        self.fp, self.mode = fp, mode
        self.base_step = 0
        self._records: dict[tuple, dict[str, Any]] = {}  # the live records, by identity (a re-log replaces)
        self._pending: tuple[int, Callable[[int], bool]] | None = None  # a checkpoint being written
        self._lock = threading.Lock()  # the live records and the file change together
        self._writer: GroupCommit | None = None
        self.unlogged = 0
        self.restored_samples = 0
        self.replayed_steps = 0

    @classmethod
    def open(cls, config, mode: str) -> "RolloutLog | None":
        t = config.trainer
        if not t.rollout_wal.enable or t.save_freq <= 0:  # nothing to resume from: nothing to keep
            return None
        path = Path(t.default_local_dir) / "rollout_wal" / f"{mode}.log"
        return cls(path, int(float(t.rollout_wal.max_mb) * 2**20), fingerprint(config, mode), mode)

    # ------------------------------------------------------------------ writing
    def _write(self, key: tuple, record: dict[str, Any], force: bool) -> bool:
        with self._lock:
            try:
                written = self.wal.append(record, force=force)
            except OSError as e:  # a full or failing disk: the run goes on, these samples are not durable
                self._disk_error(e)
                written = False
            if written:
                self._records[key] = record
        return written

    def _disk_error(self, e: OSError) -> None:
        _LOG.warning("rollout log %s: cannot write (%s); samples generated from now on are generated again after a "
                     "crash", self.wal.path, e)

    def _not_logged(self, why: str) -> None:
        self.unlogged += 1
        if self.unlogged == 1:
            _LOG.warning("rollout log %s: a sample is not logged (%s); it would be generated again after a crash. "
                         "Raise trainer.rollout_wal.max_mb or checkpoint more often (trainer.save_freq)",
                         self.wal.path, why)

    def submit_sample(self, sample: Sample, publish: Callable[[Sample], None]) -> None:
        """A finished sample: logged by the group-commit writer, then ``publish``\ ed to the trainer."""
        if self._writer is None:
            self._writer = GroupCommit(self.log_samples)
        self._writer.submit(sample, publish)

    def log_samples(self, samples: list[Sample]) -> None:
        """Finished samples, one fsync for all (the writer thread calls it)."""
        keyed = []
        for sample in samples:
            try:
                keyed.append((("sample", int(sample.ordinal)), {"kind": "sample", **encode_sample(sample)}))
            except Unencodable as e:
                self._not_logged(f"it holds {e}")
        with self._lock:
            try:
                written = self.wal.append_many([record for _, record in keyed])
            except OSError as e:
                self._disk_error(e)
                written = [False] * len(keyed)
            for (key, record), ok in zip(keyed, written):
                if ok:
                    self._records[key] = record
        for ok in written:
            if not ok:
                self._not_logged(f"the log would pass trainer.rollout_wal.max_mb={self.wal.max_bytes / 2**20:g}")

    def log_batch(self, step: int, batch: Any, loader_batches: int) -> None:
        """One-step-off: the batch generated ahead for ``step``."""
        try:
            record = {"kind": "batch", "step": int(step), "loader_batches": int(loader_batches),
                      "batch": encode(batch)}
        except Unencodable as e:
            return self._not_logged(f"it holds {e}")
        if not self._write(("batch", int(step)), record, force=False):
            self._not_logged(f"the log would pass trainer.rollout_wal.max_mb={self.wal.max_bytes / 2**20:g}")

    def log_taken(self, step: int, index: int, ids: list[int], digests: list[str]) -> None:
        """Trainer step ``step`` (mini-batch ``index``) trains the samples ``ids``."""
        self._write(("taken", int(step), int(index)), {"kind": "taken", "step": int(step), "index": int(index),
                                                       "ids": [int(i) for i in ids], "digests": list(digests)},
                    force=True)

    def log_evicted(self, step: int, ordinals: list[int]) -> None:
        if ordinals:
            self._write(("evicted", int(step), min(ordinals)), {"kind": "evicted", "step": int(step),
                                                               "ordinals": [int(o) for o in ordinals]}, force=True)

    def _header(self) -> dict[str, Any]:
        return {"kind": "header", "format": FORMAT, "fingerprint": self.fp, "mode": self.mode,
                "base_step": self.base_step}

    # ------------------------------------------------------------------ checkpoints
    def trained_since_base(self) -> list[list[Any]]:
        """``[step, index, ids, digests]`` of every step taken since the log's base checkpoint (what a checkpoint
        records as trained since the previous one)."""
        with self._lock:
            taken = sorted((k, r) for k, r in self._records.items() if k[0] == "taken")
        return [[r["step"], r["index"], r["ids"], r["digests"]] for _, r in taken]

    def checkpoint_started(self, step: int, done: Callable[[int], bool]) -> None:
        """A checkpoint of ``step`` is being written; ``done(ordinal)``: it records that sample as trained."""
        self._pending = (int(step), done)

    def checkpoint_finished(self, committed: Callable[[int], bool]) -> None:
        """Compact once the pending checkpoint is complete (``committed(step)``)."""
        if self._pending is not None and committed(self._pending[0]):
            step, done = self._pending
            self._pending = None
            self.covered(step, done)

    def covered(self, step: int, done: Callable[[int], bool]) -> None:
        """Rewrite the log without what the checkpoint of ``step`` covers."""
        with self._lock:
            self.base_step = int(step)
            self._records = {k: r for k, r in self._records.items() if not self._is_covered(k, r, step, done)}
            self.wal.rewrite([self._header(), *self._records.values()])

    @staticmethod
    def _is_covered(key: tuple, record: dict[str, Any], step: int, done: Callable[[int], bool]) -> bool:
        if key[0] == "sample":
            return done(int(record["ordinal"]))
        return int(record["step"]) <= step

    # ------------------------------------------------------------------ resume
    def restore(self, resumed_step: int, done: Callable[[int], bool], fresh: bool) -> Restored:
        """What the log holds beyond the checkpoint of ``resumed_step`` (0: none). ``fresh``: the run starts over
        (``trainer.resume_mode=disable``): the log is emptied."""
        records = self.wal.records_at_open
        header = records[0] if records and records[0].get("kind") == "header" else None
        reason = self._unusable(header, resumed_step, fresh, bool(records))
        if reason is not None:
            if records:
                _LOG.warning("rollout log %s not used: %s; its samples are generated again", self.wal.path, reason)
            self._records = {}
        else:
            self._records = {}
            for r in records[1:]:
                key = self._key(r)
                if not self._is_covered(key, r, resumed_step, done):
                    self._records[key] = r
        self.base_step = int(resumed_step)
        self.wal.rewrite([self._header(), *self._records.values()])
        return self._restored()

    def _unusable(self, header: dict[str, Any] | None, resumed_step: int, fresh: bool, any_records: bool) -> str | None:
        if fresh:
            return "the run starts fresh (trainer.resume_mode=disable)"
        if not any_records:
            return "empty"
        if header is None or header.get("format") != FORMAT:
            return "it has no header of this format"
        if header.get("fingerprint") != self.fp:
            return "it was written by a run with another mode, data, batch shape, model or seed"
        if int(header["base_step"]) > resumed_step:
            return (f"it continues the checkpoint of step {header['base_step']}, this run resumes from step "
                    f"{resumed_step}")
        return None

    @staticmethod
    def _key(r: dict[str, Any]) -> tuple:
        kind = r["kind"]
        if kind == "sample":
            return ("sample", int(r["ordinal"]))
        if kind == "taken":
            return ("taken", int(r["step"]), int(r["index"]))
        if kind == "evicted":
            return ("evicted", int(r["step"]), min(r["ordinals"]))
        return (kind, int(r["step"]))

    def _restored(self) -> Restored:
        out = Restored()
        for key, r in self._records.items():
            if key[0] == "sample":
                out.samples[key[1]] = decode_sample(r)
            elif key[0] == "evicted":
                out.evicted.extend(int(o) for o in r["ordinals"])
            elif key[0] == "batch":
                out.batches[key[1]] = (decode(r["batch"]), int(r["loader_batches"]))
        out.replay = self._replay_plan(out.samples)
        out.batches = self._contiguous_batches(out.batches)
        self.restored_samples = len(out.samples) + sum(len(b[0]) for b in out.batches.values())
        self.replayed_steps = len({k[0] for k in out.replay}) + len(out.batches)
        return out

    def _replay_plan(self, samples: dict[int, Sample]) -> dict[tuple[int, int], list[int]]:
        """The taken steps right after the base, in order, while every sample they took is restored."""
        plan: dict[tuple[int, int], list[int]] = {}
        taken = sorted(k[1:] for k in self._records if k[0] == "taken")
        expected_step = self.base_step + 1
        for step, index in taken:
            ids = self._records[("taken", step, index)]["ids"]
            if step not in (expected_step, expected_step - 1) or not all(i in samples for i in ids):
                break
            plan[(step, index)] = list(ids)
            expected_step = step + 1
        return plan

    def _contiguous_batches(self, batches: dict[int, tuple[Any, int]]) -> dict[int, tuple[Any, int]]:
        out, step = {}, self.base_step + 1
        while step in batches:
            out[step] = batches[step]
            step += 1
        return out

    def metrics(self) -> dict[str, float]:
        out = {"rollout_wal/bytes": float(self.wal.size), "rollout_wal/unlogged_samples": float(self.unlogged),
               "rollout_wal/restored_samples": float(self.restored_samples),
               "rollout_wal/replayed_steps": float(self.replayed_steps)}
        if self._writer is not None and self._writer.commits:
            out["rollout_wal/samples_per_fsync"] = self._writer.samples / self._writer.commits
        return out

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self.wal.close()
