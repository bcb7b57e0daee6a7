"""The replay buffer of verl's V1 trainer: prompt groups, their status, and the eviction / refill rules.

A *group* is one prompt and its ``rollout.n`` trajectories (a :class:`Sample`).  Every group carries the step that
submitted it (``submit_step``, verl's prompt ``global_steps`` tag) and is *pending/running* (in flight), *finished*
or *failed* (a trajectory's agent loop raised).  At step ``t`` a group submitted at step ``s`` has **age**
``t - s + 1`` (1: trained in the step that submitted it).  The buffer is the fully async controller's
:class:`SampleQueue` (same storage, same producer side) with verl's sampling rules on top:

Async modes (``colocate_async``, ``separate_async``), :meth:`ReplayBuffer.sample`: a finished group is *evicted*
when it is

* stale: its age is above ``max_off_policy_threshold`` and the strategy is ``drop``;
* filtered: DAPO filtering is on and its trajectories' metric is all equal (``classify`` says so);
* failed;

a group is evicted once (a failed group counts as failed only: staleness and the DAPO metric are judged on
groups that finished without failure, as in verl), and exactly one fresh prompt is submitted per evicted group
(``refill``).  With ``wait`` nothing is evicted for age: sampling blocks while an in-flight group has reached the
threshold, so it finishes and is trained at that age.  The oldest ``k`` sampleable groups (by submit step, then
stream order) are returned; with ``drop`` none is older than the threshold (asserted).

Synchronous mode (``sync``): nothing is in flight when sampling (generation is synchronous), staleness is moot;
:meth:`ReplayBuffer.evict_sync` evicts DAPO-filtered groups (two refills each: verl's credit) and, only with
``sync_refill_failed_groups``, failed ones (one refill each); :meth:`ReplayBuffer.select` takes the oldest ``k``
and discards the surplus (sync keeps no buffer between steps).

Metrics (verl's names): ``training/off_policy/evicted_samples`` and ``.../evicted_samples_staleness/{mean,max,min}``
(the evicted groups' ages), ``training/filter_groups/evicted_samples``, ``training/filter_groups/
discarded_surplus_samples``, ``training/rollout_failure/evicted_samples``.  :attr:`ReplayBuffer.evicted` lists
``(ordinal, reason, step)`` of every evicted group, which checkpoints record so a resumed run neither trains an
evicted prompt nor generates it again.

A user's sampler (``trainer.v1.sampler.custom_sampler.{path,name}``) is a subclass of :class:`ReplayBuffer`
built with ``sampler_kwargs``; it may override :meth:`sample` (async) or :meth:`select` / :meth:`evict_sync`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from hybridflow.trainer.asynchronous.sample_queue import RolloutFailed, Sample, SampleQueue

__all__ = ["ReplayBuffer", "SamplingRules", "load_replay_buffer", "STALE", "FILTERED", "FAILED", "SURPLUS"]

STALE, FILTERED, FAILED, SURPLUS = "stale", "filtered", "failed", "surplus"
_PREFIX = "training"


@dataclass(frozen=True)
class SamplingRules:
    """``trainer.v1.sampler`` as the buffer reads it."""

    threshold: int = 8
    strategy: str = "drop"
    refill_failed: bool = True  # async: always; sync: sync_refill_failed_groups
    stall_timeout_s: float = 3600.0  # no group finished for this long while sampling waits: stop the run


@dataclass
class _Eviction:
    metrics: dict[str, float] = field(default_factory=dict)
    stale_ages: list[int] = field(default_factory=list)

    def add(self, reason: str, groups: list[Sample], step: int) -> None:
        key = {STALE: "off_policy", FILTERED: "filter_groups", FAILED: "rollout_failure"}[reason]
        name = f"{_PREFIX}/{key}/evicted_samples"
        self.metrics[name] = self.metrics.get(name, 0.0) + float(len(groups))
        if reason == STALE:
            self.stale_ages.extend(step - g.submit_step + 1 for g in groups)

    def result(self) -> dict[str, float]:
        out = dict(self.metrics)
        if self.stale_ages:
            ages = np.asarray(self.stale_ages, dtype=np.float64)
            base = f"{_PREFIX}/off_policy/evicted_samples_staleness"
            out.update({f"{base}/mean": float(ages.mean()), f"{base}/max": float(ages.max()),
                        f"{base}/min": float(ages.min())})
        return out


class ReplayBuffer(SampleQueue):
    """Prompt groups of a V1 run (see the module docstring); thread-safe, one producer and one consumer."""

    def __init__(self, rules: SamplingRules | None = None, **sampler_kwargs: Any):
        super().__init__()
        self.rules = rules or SamplingRules()
        self.sampler_kwargs = dict(sampler_kwargs)
        self.evicted: list[tuple[int, str, int]] = []  # (ordinal, reason, step)

    # ------------------------------------------------------------------ classification
    def age(self, group: Sample, step: int) -> int:
        return int(step) - int(group.submit_step) + 1

    def _reasons(self, groups: Iterable[Sample], step: int) -> dict[int, str]:
        """ordinal -> the first reason (stale, filtered, failed) that evicts a finished group."""
        rules = self.rules
        out: dict[int, str] = {}
        for g in groups:
            if g.failed:  # a failed group is only that (verl classifies staleness and DAPO on finished groups)
                if rules.refill_failed:
                    out[g.ordinal] = FAILED
            elif rules.strategy == "drop" and self.age(g, step) > rules.threshold:
                out[g.ordinal] = STALE
            elif g.filtered:
                out[g.ordinal] = FILTERED
        return out

    def _evict(self, reasons: dict[int, str], step: int, record: _Eviction) -> int:
        """Remove the finished groups named in ``reasons`` (lock held); returns how many."""
        if not reasons:
            return 0
        keep, gone = [], []
        for item in self._finished:
            (gone if item[2].ordinal in reasons else keep).append(item)
        self._finished = keep
        for reason in (STALE, FILTERED, FAILED):
            groups = [s for _, _, s in gone if reasons[s.ordinal] == reason]
            if groups:
                record.add(reason, groups, step)
        self.evicted.extend((s.ordinal, reasons[s.ordinal], int(step)) for _, _, s in gone)
        return len(gone)

    def _oldest(self, groups: list[Sample], k: int) -> list[Sample]:
        return sorted(groups, key=lambda g: (g.submit_step, g.ordinal))[:k]

    def _take_groups(self, chosen: list[Sample]) -> None:
        ids = {g.ordinal for g in chosen}
        self._finished = [item for item in self._finished if item[2].ordinal not in ids]

    # ------------------------------------------------------------------ async sampling
    def sample(self, step: int, k: int, *, classify: Callable[[list[Sample]], list[bool]] | None = None,
               refill: Callable[[int], Any] | None = None) -> tuple[list[Sample] | None, dict[str, float]]:
        """``k`` groups for step ``step`` under the async rules (see the module docstring), and the eviction
        metrics; ``(None, metrics)`` when the stream ended with fewer.  Blocks until they are there.

        ``classify(groups) -> [filtered?]`` runs once per newly finished group (DAPO); ``refill(n)`` submits
        ``n`` fresh prompts, called once per eviction round outside the lock.
        """
        record = _Eviction()
        rules = self.rules
        last_change, last_count = time.monotonic(), -1
        start = time.perf_counter()
        try:
            while True:
                if classify is not None:
                    self._classify(classify)
                with self._cond:
                    if self._error is not None:
                        raise RolloutFailed(f"the rollouter stopped: {self._error}") from self._error
                    finished = [s for _, _, s in self._finished]
                    evicted = self._evict(self._reasons(finished, step), step, record)
                    if not evicted:
                        pool = [s for _, _, s in self._finished]
                        if len(pool) >= k and not self._blocked(step):
                            chosen = self._oldest(pool, k)
                            self._take_groups(chosen)
                            if rules.strategy == "drop":
                                ages = [self.age(g, step) for g in chosen]
                                assert max(ages) <= rules.threshold, f"drop selected stale groups: ages {ages}"
                            return chosen, record.result()
                        if self._done and not self._in_flight:
                            return None, record.result()
                        if classify is not None and any(s.filtered is None for s in pool):
                            continue  # classify what finished meanwhile before waiting
                        count = len(self._finished) + 10_000 * len(self._in_flight)
                        if count != last_count:
                            last_change, last_count = time.monotonic(), count
                        elif time.monotonic() - last_change > rules.stall_timeout_s:
                            raise TimeoutError(
                                f"step {step} waited {rules.stall_timeout_s:.0f}s for {k} groups and none finished: "
                                f"{len(self._in_flight)} in flight, {len(self._finished)} finished; the rollout "
                                "replicas stopped making progress")
                        self._cond.wait(timeout=1.0)
                        continue
                if refill is not None:
                    refill(evicted)
        finally:
            self.wait_seconds += time.perf_counter() - start

    def _blocked(self, step: int) -> bool:
        """``wait``: an in-flight group has reached the threshold, so sampling waits for it (lock held)."""
        if self.rules.strategy != "wait":
            return False
        return any(self.age(s, step) >= self.rules.threshold for s in self._in_flight.values())

    def _classify(self, classify: Callable[[list[Sample]], list[bool]]) -> None:
        with self._cond:
            todo = [s for _, _, s in self._finished if s.filtered is None]
        for group in [g for g in todo if g.failed]:  # no metric to compare: the failure decides
            group.filtered = False
        todo = [g for g in todo if not g.failed]
        if not todo:
            return
        flags = list(classify(todo))
        if len(flags) != len(todo):
            raise RuntimeError(f"the group filter classified {len(flags)} of {len(todo)} groups")
        for group, flag in zip(todo, flags):
            group.filtered = bool(flag)

    # ------------------------------------------------------------------ synchronous sampling
    def evict_sync(self, step: int, classify: Callable[[list[Sample]], list[bool]] | None = None
                   ) -> tuple[int, dict[str, float]]:
        """Evict the finished groups the synchronous rules reject; returns (prompts to refill, metrics):
        two per filtered group (verl's credit), one per failed group with ``refill_failed``."""
        if classify is not None:
            self._classify(classify)
        record = _Eviction()
        with self._cond:
            finished = [s for _, _, s in self._finished]
            reasons = {g.ordinal: FILTERED for g in finished if g.filtered and not g.failed}
            if self.rules.refill_failed:
                reasons.update({g.ordinal: FAILED for g in finished if g.failed})
            self._evict(reasons, step, record)
        credit = sum(2 if r == FILTERED else 1 for r in reasons.values())
        return credit, record.result()

    def select(self, step: int, k: int) -> tuple[list[Sample] | None, dict[str, float]]:
        """The oldest ``k`` finished groups, the rest discarded (synchronous sampling keeps no buffer);
        ``(None, {})`` when fewer than ``k`` are there."""
        with self._cond:
            pool = [s for _, _, s in self._finished]
            if len(pool) < k:
                return None, {}
            chosen = self._oldest(pool, k)
            ids = {g.ordinal for g in chosen}
            surplus = [g for g in pool if g.ordinal not in ids]
            self._finished = []
            self.evicted.extend((g.ordinal, SURPLUS, int(step)) for g in surplus)
        metrics = {f"{_PREFIX}/filter_groups/discarded_surplus_samples": float(len(surplus))} if surplus else {}
        return chosen, metrics

    def pending_groups(self) -> int:
        with self._cond:
            return len(self._in_flight)


def load_replay_buffer(path: str | None, name: str | None, rules: SamplingRules,
                       sampler_kwargs: dict[str, Any] | None = None) -> ReplayBuffer:
    """The run's buffer: :class:`ReplayBuffer`, or the user's subclass from ``custom_sampler.{path,name}``."""
    if not path:
        return ReplayBuffer(rules, **(sampler_kwargs or {}))
    import importlib.util
    import os

    file = os.path.expanduser(str(path))
    spec = importlib.util.spec_from_file_location(f"hybridflow_user_sampler_{abs(hash(file))}", file)
    if spec is None or spec.loader is None:
        raise ValueError(f"trainer.v1.sampler.custom_sampler.path={path!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = getattr(module, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, ReplayBuffer)):
        raise ValueError(f"trainer.v1.sampler.custom_sampler.name={name!r}: {path} must define a subclass of "
                         "hybridflow.trainer.asynchronous.replay_buffer.ReplayBuffer with that name")
    return cls(rules, **(sampler_kwargs or {}))
