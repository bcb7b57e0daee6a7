"""The actor's rollout split over shard groups: ``hf`` with ``actor_rollout_ref.rollout.tensor_model_parallel_size=k``.

The worker group's ranks form ``world / k`` shard groups of ``k`` ranks (``rollout/hf/lockstep.rollout_shard_groups``:
HybridFlow's grouping when the training tp is a multiple of k).  Each rank holds one shard of the rollout model; the
group's leader serves requests, the others follow it (``rollout/hf/sharded_engine.py``).

Two ways the shard gets its weights:

* **in place** -- the training layout is the rollout's (training tp = k over the same ranks; no pipeline, no expert
  split over the data ranks, no LoRA: a LoRA actor's shard is switched, its adapters merged piece by piece by
  ``engine/lora_pieces.py``): the engine generates with the actor's own module, its FSDP shards gathered
  for the generation as the unsplit hybrid engine does; nothing is copied and the switch moves nothing;
* **switched** -- otherwise the shard is a module of its own, built without storage and filled after every update by
  ``engine/shard_switch.switch_to_rollout``: each rank receives only the slices of its shard, bucket by bucket.

``actor_rollout_ref.rollout.free_cache_engine`` frees the KV cache on sleep as always, and
``actor_rollout_ref.rollout.free_weights_on_sleep`` (null = true) frees a switched shard's weights too
(``engine/shard_switch.release_shard``): during training a rank holds its training shards only, and the next switch
allocates the shard again as it fills it. ``false`` keeps the shard (1/k of the model) allocated between
generations. An in-place shard is the actor's own module: there is nothing of its own to free.

Weight facts per shard (``engine/shard_checksum.py``): at every switch the training pieces' additive checksums are
summed over the ranks and every rollout group's pieces must add up to them (a mismatch raises
``WeightMismatchError`` naming the group and tensor); at wake-up each rank's shard must still hold what the switch
verified. A kept shard receives only the tensors whose training checksum changed since the last switch (delta sync);
a freed one is refilled whole.
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.distributed as dist

from hybridflow.engine.forward import eval_mode
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.rollout.hf.lockstep import LockstepChannel, rollout_shard_groups
from hybridflow.rollout.hf.shard_model import KEY, build_model_shard, gathered_logits
from hybridflow.rollout.hf.sharded_engine import ShardedHFRolloutEngine
from hybridflow.workers.rollout_host import RolloutHost, WeightMismatchError

__all__ = ["ShardedRolloutHost", "build_sharded_rollout", "reuses_training_shards"]


def reuses_training_shards(dims, groups: list[tuple[int, ...]], lora: bool) -> bool:
    """Whether the actor's module is already laid out as the rollout shard groups want it."""
    k = len(groups[0])
    if lora or dims.pp > 1 or dims.ep > 1 or dims.tp != k:
        return False
    return all(list(g) == dims.tp_peers(g[0]) for g in groups)


class ShardedRolloutHost(RolloutHost):
    """A :class:`RolloutHost` whose engine is one shard of a split model: the leader serves, a follower runs the
    leader's steps in a thread of its own between ``wake_up`` and ``sleep``; :meth:`sync_weights` is the switch."""

    def __init__(self, engine: ShardedHFRolloutEngine, train_engine: TrainEngine, name: str, shares_weights: bool,
                 bucket_bytes: int, stall_timeout_s: float, wait_s: float, groups: list[tuple[int, ...]],
                 free_weights_on_sleep: bool = True):
        super().__init__(engine, train_engine, name=name, shares_weights=shares_weights, delta=False,
                         stall_timeout_s=stall_timeout_s, bucket_bytes=bucket_bytes)
        self.wait_s = float(wait_s)
        self.free_weights_on_sleep = bool(free_weights_on_sleep) and not shares_weights
        self._plan = None
        self._freed: dict[str, int] | None = None  # the released shard's storage sizes, until the next switch
        self.groups = [tuple(g) for g in groups]  # every rollout shard group (the checksum check sums each)
        self._totals = None  # the training checksums at the last switch (engine/shard_checksum.py)
        self._held_sums = None  # this rank's rollout-piece checksums after the last switch
        self._verified_since_sleep = False  # a switch checked the shard after the last sleep: wake-up need not
        self._follower: threading.Thread | None = None
        self._follower_error: list[BaseException] = []

    @property
    def is_leader(self) -> bool:
        return self.engine.is_leader

    def replica(self, host_role):
        """The leader's replica; ``None`` on a follower (it serves no requests of its own)."""
        return super().replica(host_role) if self.is_leader else None

    def _generation_context(self, stack: contextlib.ExitStack) -> None:
        if self.shares_weights:
            module = stack.enter_context(self.train_engine.full_params())
            stack.enter_context(eval_mode(module))
            stack.enter_context(gathered_logits(module))

    def wake_up(self, seed: int | None = None) -> None:
        if self._awake is not None:
            return
        if self._freed is not None:  # woken without a switch since the shard was freed: fill it first
            self.sync_weights()
        if not self._verified_since_sleep:  # a switch since the last sleep has just checked every piece
            self._check_after_wake()
        stack = contextlib.ExitStack()
        try:
            self._generation_context(stack)
            if self.is_leader:
                self.server.call(lambda: (self.engine.wake_up(), seed is not None and self.engine.reseed(seed)),
                                 what="wake_up")
            else:
                self._follower_error.clear()
                self._follower = threading.Thread(target=self._follow, name=f"{self.server.name}-follower",
                                                  daemon=True)
                self._follower.start()
        except BaseException:
            stack.close()
            raise
        self._awake = stack

    def _follow(self) -> None:
        try:
            self.engine.follow()
        except BaseException as exc:  # noqa: BLE001 - raised by sleep(), on the worker's thread
            self._follower_error.append(exc)

    def sleep(self) -> None:
        if self._awake is None:
            return
        stack, self._awake = self._awake, None
        try:
            if self.is_leader:
                self.server.call(self.engine.sleep, what="sleep")
            else:
                self._join_follower()
        finally:
            stack.close()
        self._verified_since_sleep = False
        if self.free_weights_on_sleep and self._plan is not None:
            from hybridflow.engine.shard_switch import release_shard

            self._freed = release_shard(self.engine.model, self._plan)

    def held_weight_bytes(self) -> int:
        """Bytes this rank holds for the rollout shard beyond its training shards (0 while a freed shard sleeps)."""
        from hybridflow.engine.lora_pieces import training_state
        from hybridflow.engine.shard_switch import held_bytes, plan_switch

        if self._plan is None:
            self._plan = plan_switch(training_state(self.train_engine.module), self.engine.model)
        return held_bytes(self.engine.model, self._plan)

    def _join_follower(self) -> None:
        thread, self._follower = self._follower, None
        if thread is not None:
            thread.join(timeout=self.wait_s)
            if thread.is_alive():
                raise TimeoutError(f"rollout shard '{self.server.name}': its leader did not end the generation within "
                                   f"{self.wait_s:.0f} s (actor_rollout_ref.nccl_timeout)")
        if self._follower_error:
            raise RuntimeError(f"rollout shard '{self.server.name}' lost step with its leader") \
                from self._follower_error[0]

    def sync_weights(self) -> float:
        """The switch: every rank's rollout shard filled from the training shards (a collective over the group);
        in place nothing moves.  A kept shard receives only the tensors whose training checksum changed since the
        last switch (delta sync); after the switch every rollout group's pieces are checked against the training
        checksums (:func:`hybridflow.engine.shard_checksum.verify`, a mismatch raises ``ShardMismatchError``).
        The stats go to :attr:`last_sync` (``update_weights/*``, ``weight_sync/*``, ``perf/max_memory_*``)."""
        import time

        from hybridflow.engine import shard_checksum as checks
        from hybridflow.engine.lora_pieces import training_state
        from hybridflow.engine.shard_switch import _state_tensors, plan_switch, restore_shard, switch_to_rollout

        start = time.perf_counter()
        rank = dist.get_rank()
        checked: dict[str, float] = {}
        with self.train_engine.on_device():
            train = training_state(self.train_engine.module)  # a LoRA actor's weights merged piece by piece
            if self._plan is None:
                self._plan = plan_switch(train, self.engine.model)
            if self.shares_weights:  # the engine generates with the actor's own module: nothing moves or can differ
                stats = switch_to_rollout(train, self.engine.model, self._plan, self.bucket_bytes)
                self.weight_fact = {"engine": self.server.name, "when": "after the switch", "match": None,
                                    "why": "the shard is the actor's own module (in place)"}
            else:
                totals = checks.training_totals(self._plan, train, rank)
                indices = None  # a freed shard is refilled whole
                if self._freed is not None:
                    restore_shard(self.engine.model, self._freed)
                    self._freed = None
                else:
                    indices = checks.changed(totals, self._totals)
                stats = switch_to_rollout(train, self.engine.model, self._plan, self.bucket_bytes, indices=indices)
                self._held_sums = checks.rollout_sums(self._plan, _state_tensors(self.engine.model), rank)
                try:
                    fact = checks.verify(self._plan, totals, self._held_sums, self.groups)
                except checks.ShardMismatchError as exc:
                    raise WeightMismatchError(f"rollout shard '{self.server.name}': {exc}") from exc
                self._totals = totals
                self._verified_since_sleep = True
                self.weight_fact = {"engine": self.server.name, "when": "after the switch", **fact}
                checked = {"weight_sync/tensors_unchanged": float(len(self._plan.names) - stats.tensors),
                           "weight_sync/checksum_worst_rel": float(fact["worst_rel"])}
        self.last_sync = {**stats.update_weights_metrics(), **stats.memory_metrics(),
                          "update_weights/shard_bytes": float(stats.bytes_total),
                          "update_weights/received_bytes": float(stats.received_bytes),
                          "update_weights/in_place": float(self.shares_weights), **checked}
        return time.perf_counter() - start

    def _check_after_wake(self) -> None:
        """This rank's shard must still hold what the last switch verified (stale after sleep / wake)."""
        if self._held_sums is None or self._freed is not None:
            return
        from hybridflow.engine import shard_checksum as checks
        from hybridflow.engine.shard_switch import _state_tensors

        now = checks.rollout_sums(self._plan, _state_tensors(self.engine.model), dist.get_rank())
        for i, name in enumerate(self._plan.names):
            if not torch.equal(now[i], self._held_sums[i]):
                raise WeightMismatchError(
                    f"rollout shard '{self.server.name}': {name!r} changed since the last switch verified it "
                    "(stale or overwritten weights at wake-up)")
        self.weight_fact = {**self.weight_fact, "when": "after wake_up"}

    def abort(self) -> None:
        if self.is_leader:
            super().abort()

    def interrupt(self) -> int:
        return super().interrupt() if self.is_leader else 0

    def resume(self) -> None:
        if self.is_leader:
            super().resume()

    def close(self) -> None:
        try:
            self.sleep()
        finally:
            self.server.close()


def build_sharded_rollout(train_engine: TrainEngine, model_config, tokenizer, rc, name: str, lora: bool,
                          timeout_s: float) -> ShardedRolloutHost:
    """The rank's shard of the rollout and its host (a collective: every rank of the worker group calls it)."""
    k = int(rc.tensor_model_parallel_size)
    world, rank = dist.get_world_size(), dist.get_rank()
    dims = train_engine.parallel_dims
    if lora and dims.pp > 1:
        raise ValueError(f"{KEY}={k} with LoRA and pipeline stages: the adapters are merged piece by piece as the "
                         "switch reads them, a collective every rank must join, and a stage lacks its peers' layers; "
                         "set it to 1")
    groups = rollout_shard_groups(world, k, dims.tp if dims.pp == 1 else 1)
    channel = LockstepChannel.create(groups, rank, timeout_s)
    in_place = reuses_training_shards(dims, groups, lora)
    if in_place:
        model = train_engine.module
    else:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh(train_engine.device.type, torch.tensor(groups), mesh_dim_names=("rollout_dp", "rollout_tp"))
        first = next(train_engine.module.parameters())
        base = train_engine.module.get_base_model() if lora else train_engine.module  # plain buffer names
        model = build_model_shard(model_config, mesh["rollout_tp"], train_engine.device, first.dtype, base)
    engine = ShardedHFRolloutEngine(
        model, tokenizer, channel=channel, max_batch_size=int(rc.max_num_seqs), name=name,
        seed=int(rc.seed) + channel.group.replica, exact_log_probs=bool(rc.exact_log_probs))
    bucket_bytes = int(rc.checkpoint_engine.update_weights_bucket_megabytes) << 20
    free = rc.free_weights_on_sleep is not False  # null: free (the paper's engine holds no shard during training)
    return ShardedRolloutHost(engine, train_engine, name, in_place, bucket_bytes, float(rc.stall_timeout_s), timeout_s,
                              groups, free_weights_on_sleep=free)
