"""``RolloutServerWorker``: one standalone rollout replica (split placement, async training).

Where the hybrid engine generates with the actor's own module, a standalone replica owns an engine built
from ``actor_rollout_ref.model.path`` on devices of its own (the ``rollout`` pool:
``rollout.nnodes x rollout.n_gpus_per_node``, one replica per device; one in this process with
``trainer.backend=local``).  It serves requests from the agent loops on an
:class:`~hybridflow.rollout.service.interruptible_server.InterruptibleRolloutServer` and receives the actor's weights
through the checkpoint engine (:mod:`hybridflow.rollout.weights.checkpoint_engine`): rank 0 of that group is the
actor's rank 0, replica ``i`` is rank ``i + 1``.

The worker group is driven by :class:`~hybridflow.rollout.service.standalone_fleet.StandaloneFleet`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from hybridflow.controller import Dispatch, Worker, register
from hybridflow.engine.model_loader import load_causal_lm, load_processor, load_tokenizer
from hybridflow.rollout.weights.checkpoint_engine import BroadcastCheckpointEngine, WeightSyncSpec
from hybridflow.rollout.service.interruptible_server import InterruptibleRolloutServer
from hybridflow.rollout.service.replica import RolloutReplica, replica_for_server
from hybridflow.utils.load_object import import_source

if TYPE_CHECKING:
    from hybridflow.config.schema import ActorRolloutRefConfig, RolloutConfig

__all__ = ["RolloutServerWorker", "hf_engine_kwargs"]


def hf_engine_kwargs(rollout_config: RolloutConfig, seed: int) -> dict[str, Any]:
    """The ``hf`` engine's settings from verl's ``actor_rollout_ref.rollout`` keys."""
    rc = rollout_config
    return {
        "max_num_seqs": int(rc.max_num_seqs),
        "max_model_len": None if rc.max_model_len is None else int(rc.max_model_len),
        "max_num_batched_tokens": int(rc.max_num_batched_tokens),
        "enable_prefix_caching": bool(rc.enable_prefix_caching),
        "free_cache_engine": bool(rc.free_cache_engine),
        "gpu_memory_utilization": float(rc.gpu_memory_utilization),
        "dtype": rc.dtype,
        "seed": int(seed),
        "exact_log_probs": bool(rc.exact_log_probs),
    }


class RolloutServerWorker(Worker):
    """A replica built from an ``ActorRolloutRefConfig`` (model, the actor's parameter dtype, rollout keys)."""

    def __init__(self, config: ActorRolloutRefConfig):
        super().__init__()
        self.config = config
        self.name = f"rollout/replica{self.rank}"
        self.server: InterruptibleRolloutServer | None = None
        self.engine = None
        self.weight_version = 0
        self._sync: BroadcastCheckpointEngine | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the tokenizer and the model (the actor's parameter dtype: the synced weights fit exactly)."""
        from hybridflow.rollout import create_rollout_engine

        mc, rc = self.config.model, self.config.rollout
        if mc.external_lib:
            import_source(mc.external_lib, key="actor_rollout_ref.model.external_lib")
        tokenizer = load_tokenizer(mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
                                   field="actor_rollout_ref.model.tokenizer_path")
        processor = load_processor(mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
                                   field="actor_rollout_ref.model.tokenizer_path")
        model = load_causal_lm(mc.path, dtype=self.config.actor.fsdp_config.model_dtype,
                               trust_remote_code=mc.trust_remote_code, override_config=mc.override_config)
        model.requires_grad_(False)
        model.to(self.device).eval()
        self.engine = create_rollout_engine("hf", model=model, tokenizer=tokenizer, processor=processor,
                                            name=self.name, **hf_engine_kwargs(rc, int(rc.seed) + self.rank))
        self.server = InterruptibleRolloutServer(self.engine, name=self.name, stall_timeout_s=float(rc.stall_timeout_s))

    # ------------------------------------------------------------------ data plane
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_replica(self, host_role: str | None = None) -> RolloutReplica:
        """The handle agent loops use to reach this replica (picklable under Ray); ``host_role``: the role this
        worker has in a colocated host (a judge beside the actor)."""
        return replica_for_server(self._server(), "rollout_stream", host_role)

    def rollout_stream(self, requests):
        """Data plane (not dispatched): serve ``requests``, yielding outputs as they finish."""
        yield from self._server().stream(requests)

    # ------------------------------------------------------------------ lifecycle
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_up_rollout(self, seed: int | None = None) -> None:
        server = self._server()
        server.call(self.engine.wake_up, what="wake_up")
        if seed is not None:
            server.call(lambda: self.engine.reseed(int(seed) + self.rank), what="reseed")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_rollout(self) -> None:
        self._server().call(self.engine.sleep, what="sleep")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def interrupt_rollout(self) -> int:
        """Stop generating now for a weight sync; in-flight requests continue after :meth:`resume_rollout`."""
        return self._server().interrupt()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def resume_rollout(self) -> None:
        self._server().resume()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_rollout(self) -> int:
        return int(self.engine.abort_all() or 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self) -> dict[str, Any]:
        server = self._server()
        return {"name": self.name, "weight_version": self.weight_version, "continued": server.continued}

    # ------------------------------------------------------------------ weights
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def connect_weight_sync(self, spec: WeightSyncSpec) -> None:
        """Join the trainer -> rollout weight-sync group as rank ``1 + replica index``."""
        self._sync = BroadcastCheckpointEngine(spec, 1 + self.rank, self.device).connect()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int) -> dict[str, float]:
        """Receive the actor's weights bucket by bucket into the engine; they are weight version ``version``."""
        if self._sync is None:
            raise RuntimeError(f"{self.name}: connect_weight_sync must run before receive_weights")
        start = time.perf_counter()
        server, engine = self._server(), self.engine
        copied = 0
        try:
            for bucket in self._sync.receive_buckets():  # only buckets whose checksum matched
                copied += server.call(lambda b=bucket: engine.update_weights(b), what="weights")
        except BaseException as exc:  # the sender must not wait for this replica until its timeout
            self._sync.abort(exc)
            raise
        self.weight_version = int(version)
        return {"tensors": float(copied), "seconds": time.perf_counter() - start,
                "corrupt_buckets": float(self._sync.corrupt_buckets)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_weights_digest(self, names: list[str]) -> str | None:
        """The digest of the engine's weights over ``names`` (:mod:`hybridflow.rollout.weights.digest`)."""
        from hybridflow.rollout.weights.digest import weights_digest

        tensors = self.engine.weight_tensors(list(names))
        return None if tensors is None else weights_digest(tensors, list(names))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_checksum(self) -> float:
        """Sum of all parameters (tests compare it with the actor's)."""
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.engine.model.parameters()))

    def release(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    def _server(self) -> InterruptibleRolloutServer:
        if self.server is None:
            raise RuntimeError(f"{self.name}: init_model has not run (or the replica was released)")
        return self.server
