"""``ActorRolloutRefWorker``: the policy in its three roles, colocated in one SPMD worker.

``role`` is one of ``actor``, ``rollout``, ``ref``, ``actor_rollout``, ``actor_rollout_ref``.  When the
role holds both actor and rollout this is the *hybrid engine* of HybridFlow (Sheng et al. 2024,
arXiv:2409.19256): the ``hf`` rollout engine generates with the very ``nn.Module`` the actor trains,
so after every update the rollout already sees the new weights -- nothing is copied.  With FSDP over
several ranks the module is unsharded once for the whole generation (``TrainEngine.full_params``).

The reference policy is a separate frozen model -- the actor's starting point, or another checkpoint named by
``actor_rollout_ref.ref.model.path`` -- or, when the actor trains LoRA adapters and no other reference is named,
the actor itself with its adapters disabled (no second copy of the base weights).  ``refresh_reference`` copies
the actor's current weights into it (``trainer.ref_update_freq``, SPIN's moving opponent).

The actor and the reference each run on a ``ParallelDims`` layout (data parallel x Ulysses sequence parallel,
``*.ulysses_sequence_parallel_size``): their log-prob and update methods use the controller's mesh-aware dispatch,
which splits a batch over the dp groups only and gives the sp ranks of a group the same rows.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from hybridflow.controller import Dispatch, Worker, make_nd_compute_dataproto_dispatch_fn, register
from hybridflow.engine.engine_checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.engine.dist_checkpoint import start_from_dist_checkpoint
from hybridflow.workers.teacher_topk import compute_topk_outputs, wants_topk
from hybridflow.engine.lora_options import LoraOptions
from hybridflow.engine.model_loader import apply_lora, load_causal_lm, load_lora_adapter, load_processor, load_tokenizer
from hybridflow.engine.parallel.parallelize import pipeline_spec_for
from hybridflow.engine.activation_memory import act_on, decide_for_role
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.vision import freeze_vision_tower
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.algorithms.batch_ops import PI_OLD_WEIGHTS
from hybridflow.protocol import DataProto
from hybridflow.workers.actor import PPOActor, compute_token_outputs
from hybridflow.workers.micro_batching import MicroBatchSpec
from hybridflow.workers.rollout_host import RolloutHost
from hybridflow.utils.load_object import import_source

if TYPE_CHECKING:
    from hybridflow.config.schema import ActorRolloutRefConfig

__all__ = ["ActorRolloutRefWorker", "ROLES"]

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")


def _local(param: torch.Tensor) -> torch.Tensor:
    """A parameter's local storage (an FSDP2 ``DTensor``'s shard)."""
    return param.to_local() if hasattr(param, "to_local") else param


def _import_external_lib(name: str | None) -> None:
    """``model.external_lib``: a module whose import registers custom HF architectures."""
    if name:
        import_source(name, key="actor_rollout_ref.model.external_lib")


class ActorRolloutRefWorker(Worker):
    """Actor / rollout / reference worker built from an ``ActorRolloutRefConfig``."""

    def __init__(self, config: ActorRolloutRefConfig, role: str):
        super().__init__()
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role must be one of {ROLES}, got {role!r}")
        self.config = config
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        # verl: a saved adapter (lora_adapter_path) makes the run LoRA even with lora_rank=0
        self._lora = int(config.model.lora_rank) > 0 or config.model.lora_adapter_path is not None
        # dp x sp x tp (ep inside dp): Ulysses sp and, with strategy=megatron, the megatron node's tp / ep
        self._actor_dims = ParallelDims.for_role(self.world_size, config.actor, "actor_rollout_ref.actor")
        if self._lora and self._is_actor and not config.ref.model:  # the reference is the actor without its adapters
            self._ref_dims = self._actor_dims
        else:
            self._ref_dims = ParallelDims.for_role(self.world_size, config.ref, "actor_rollout_ref.ref")
        for mesh, dims in (("actor", self._actor_dims), ("ref", self._ref_dims)):
            self._register_dispatch_collect_info(mesh, dp_rank=dims.dp_rank(self.rank), is_collect=dims.is_collect(self.rank))
        self._register_dispatch_collect_info("rollout", dp_rank=self.rank, is_collect=True)
        self.tokenizer = None
        self.processor = None  # the multimodal processor of a vision-language checkpoint (saved with checkpoints)
        self.actor_engine: TrainEngine | None = None
        self.actor: PPOActor | None = None
        self.ref_engine: TrainEngine | None = None
        self.rollout: RolloutHost | None = None
        self.activation_checkpointing = None  # the actor's CheckpointingDecision once its model is built
        self._weight_sync = None  # split placement: the checkpoint engine to standalone replicas (rank 0)

    # ------------------------------------------------------------------ construction
    def _load_policy_module(self, fsdp_config, trainable: bool, reference: bool = False):
        mc = self.config.model
        ref_model = self.config.ref.model if reference else None
        if ref_model:  # a reference of its own (actor_rollout_ref.ref.model.path)
            module = load_causal_lm(
                ref_model["path"], dtype=fsdp_config.model_dtype,
                trust_remote_code=bool(ref_model.get("trust_remote_code", mc.trust_remote_code)),
                override_config=ref_model.get("override_config") or {}, field="actor_rollout_ref.ref.model.path",
            )
            module.requires_grad_(False)
            return module
        module = load_causal_lm(
            mc.path, dtype=fsdp_config.model_dtype, trust_remote_code=mc.trust_remote_code,
            override_config=mc.override_config, field="actor_rollout_ref.model.path", hf_config_path=mc.hf_config_path,
        )
        role = "ref" if reference else "actor"
        start_from_dist_checkpoint(module, getattr(self.config, role), f"actor_rollout_ref.{role}")
        if trainable and self.config.actor.freeze_vision_tower:
            freeze_vision_tower(module)
        if trainable and mc.lora_adapter_path:  # start from a saved adapter (its config sets rank and alpha)
            module = load_lora_adapter(module, mc.lora_adapter_path)
        elif trainable and self._lora:
            module = apply_lora(module, mc.lora_rank, mc.lora_alpha, mc.target_modules, mc.exclude_modules,
                                options=LoraOptions.from_node(mc.lora))
        if trainable:
            rollout = self.config.rollout  # enable_gradient_checkpointing: as set, or (null) decided by memory
            self.activation_checkpointing = act_on(decide_for_role(
                module, mc.enable_gradient_checkpointing, "actor_rollout_ref.model.enable_gradient_checkpointing",
                self.config.actor, fsdp_config, sequence=int(rollout.prompt_length) + int(rollout.response_length),
                device=self.device.type, dims=self._actor_dims), module, "actor", announce=self.rank == 0)
        if not trainable:
            module.requires_grad_(False)
        return module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> None:
        """Load tokenizer and models, shard them, build optimizer/schedule and the rollout engine."""
        # The process group is joined here, not in __init__: rank 0 is constructed before the other
        # ranks exist, so a rendezvous in the constructor would wait forever.
        if self.world_size > 1:
            self.init_distributed(timeout_s=float(self.config.nccl_timeout))
        mc = self.config.model
        _import_external_lib(mc.external_lib)
        self.tokenizer = load_tokenizer(
            mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
            field="actor_rollout_ref.model.tokenizer_path",
        )
        self.processor = load_processor(mc.tokenizer_path or mc.path, mc.trust_remote_code, mc.custom_chat_template,
                                        field="actor_rollout_ref.model.tokenizer_path")
        torch.manual_seed(int(self.config.actor.fsdp_config.seed))
        if self._is_actor:
            ac = self.config.actor
            module = self._load_policy_module(ac.fsdp_config, trainable=True)
            self.actor_engine = TrainEngine(module, ac.fsdp_config, ac.optim, total_training_steps,
                                            role="actor", parallel_dims=self._actor_dims,
                                            activation_offload=bool(mc.enable_activation_offload),
                                            pipeline=pipeline_spec_for(ac))
            self.actor = PPOActor(ac, self.actor_engine, ac.use_remove_padding, rollout_n=self.config.rollout.n)
            self._configure_fused_head(module, bool(ac.use_fused_kernels))
            if self.config.rollout.exact_log_probs:  # the rollout's arithmetic, batch-invariant (rollout/hf/exact.py)
                from hybridflow.rollout.hf.exact import prepare_exact_model

                prepare_exact_model(module, vision=self.processor is not None)
        if self._is_ref and not (self._lora and self._is_actor and not self.config.ref.model):
            if self.config.ref.model:
                self._check_reference_vocab(self.config.ref.model)
            module = self._load_policy_module(self.config.ref.fsdp_config, trainable=False, reference=True)
            self.ref_engine = TrainEngine(module, self.config.ref.fsdp_config, None, role="ref",
                                          parallel_dims=self._ref_dims, pipeline=pipeline_spec_for(self.config.ref))
            self._configure_fused_head(module, bool(mc.use_fused_kernels))
        if self._is_rollout and self.config.hybrid_engine:  # hybrid_engine=false: standalone server replicas
            self._build_rollout()

    def _configure_fused_head(self, module, enabled: bool) -> None:
        """The LM head fused with its log-softmax (``engine/fused_head.py``) when ``use_fused_kernels``."""
        from hybridflow.engine.fused_head import configure_fused_head

        configure_fused_head(module, enabled, int(self.config.model.fused_kernel_options.chunk_size))

    def _check_reference_vocab(self, ref_model: dict) -> None:
        """The reference scores the policy's token ids: its tokenizer must map them to the same tokens."""
        other = load_tokenizer(ref_model["path"], bool(ref_model.get("trust_remote_code", False)),
                               require_chat_template=False, field="actor_rollout_ref.ref.model.path")
        if other.get_vocab() != self.tokenizer.get_vocab():
            raise ValueError(
                f"actor_rollout_ref.ref.model.path={ref_model['path']!r} has another vocabulary than the policy "
                f"({self.config.model.path!r}): its log-probs of the policy's token ids would score other tokens; use "
                "a reference (or teacher) of the same tokenizer family")

    def _build_rollout(self) -> None:
        """The rank's rollout engine: ``hf`` generates with the actor's own module (nothing to sync); ``vllm``
        and ``sglang`` hold their own copy, loaded here from the actor (verl's default ``load_format=dummy``
        starts them with random weights) and after every update (``sync_rollout_weights``)."""
        from hybridflow.rollout import ROLLOUT_ENGINES, create_rollout_engine

        rc, mc = self.config.rollout, self.config.model
        if rc.name not in ("hf", "vllm", "sglang"):
            raise ValueError(f"actor_rollout_ref.rollout.name={rc.name!r}: the hybrid worker runs hf, vllm or sglang")
        if self.actor_engine is None:  # rollout-only role: a frozen copy to generate with (hf) / sync from
            module = self._load_policy_module(self.config.actor.fsdp_config, trainable=False)
            self.actor_engine = TrainEngine(module, self.config.actor.fsdp_config, None, role="rollout")
        name = f"{self.role}/rank{self.rank}"
        if rc.name == "hf" and int(rc.tensor_model_parallel_size) > 1 and self.world_size > 1:
            from hybridflow.workers.sharded_rollout import build_sharded_rollout  # the model split over k ranks

            self.rollout = build_sharded_rollout(self.actor_engine, self.actor_engine.module.config, self.tokenizer,
                                                 rc, name, self._lora, float(self.config.nccl_timeout))
            self.rollout.sync_weights()
            return
        # an actor split by tensor / expert parallelism cannot generate with its own module (its layers run over
        # several ranks): the hf engine gets a module of its own; it and vLLM are filled bucket by bucket after
        # every update, each rank gathering one bucket of the split weights at a time
        split = self.actor_engine.parallel_dims.nd
        own_copy = rc.name == "hf" and split
        streamed = split and rc.name in ("hf", "vllm")
        bucket_bytes = int(rc.checkpoint_engine.update_weights_bucket_megabytes) << 20 if streamed else None
        if rc.name == "hf":
            model = self.actor_engine.module
            if own_copy:
                model = self._load_policy_module(self.config.actor.fsdp_config, trainable=False).to(self.device).eval()
            engine = create_rollout_engine(
                "hf", model=model, tokenizer=self.tokenizer, processor=self.processor,
                max_batch_size=int(rc.max_num_seqs), seed=int(rc.seed) + self.rank, name=name,
                exact_log_probs=bool(rc.exact_log_probs),
            )
        else:
            kwargs: dict[str, Any] = {"model_path": mc.path, "rollout_config": rc, "tokenizer": self.tokenizer,
                                      "seed": int(rc.seed) + self.rank, "name": name}
            if rc.name == "vllm":
                kwargs.update(lora_rank=int(mc.lora_rank), lora_alpha=float(mc.lora_alpha),
                              trust_remote_code=bool(mc.trust_remote_code))
            engine = ROLLOUT_ENGINES.get(rc.name)(**kwargs)
        shares_weights = rc.name == "hf" and not own_copy
        delta = bool((rc.checkpoint_engine.engine_kwargs or {}).get("delta", True))
        self.rollout = RolloutHost(engine, self.actor_engine, name=name, shares_weights=shares_weights, delta=delta,
                                   stall_timeout_s=float(rc.stall_timeout_s), bucket_bytes=bucket_bytes)
        if not shares_weights:
            self.rollout.sync_weights()

    def release(self) -> None:
        """Stop the rollout engine (its server thread; for vLLM its driver thread and memory)."""
        if self.rollout is not None:
            self.rollout.close()
            self.rollout = None

    # ------------------------------------------------------------------ rollout service (hybrid engine)
    def _rollout_host(self) -> RolloutHost:
        if self.rollout is None:
            raise RuntimeError(f"the rollout service needs a role with 'rollout' (this worker is {self.role!r})")
        return self.rollout

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_replica(self, host_role: str | None = None):
        """The handle agent loops use to reach this rank's engine (picklable under Ray)."""
        return self._rollout_host().replica(host_role)

    def rollout_stream(self, requests):
        """Data plane (not dispatched): serve ``requests`` on this rank, yielding outputs as they finish."""
        yield from self._rollout_host().stream(requests)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_up_rollout(self, global_step: int | None = None) -> None:
        """Before a generation, on every rank together: full weights, eval mode, KV memory.

        ``global_step`` restarts the engine's own sampling stream (used by requests without a seed) at a
        function of (rollout.seed, step, rank), so a resumed run samples what the uninterrupted one did.
        """
        seed = None if global_step is None else int(self.config.rollout.seed) + 7919 * int(global_step) + self.rank
        self._rollout_host().wake_up(seed)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_rollout(self) -> None:
        """After a generation: free the KV cache and reshard the module for training."""
        self._rollout_host().sleep()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_rollout_weights(self) -> float | dict[str, float] | None:
        """Actor -> rollout weights: the seconds spent (with the transition's ``update_weights/*`` stats when they
        were streamed in buckets); ``None`` when the engine generates with the actor's own module."""
        host = self._rollout_host()
        seconds = host.sync_weights()
        if seconds is None or not host.last_sync:
            return seconds
        return {"seconds": seconds, **host.last_sync}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_weight_fact(self) -> dict[str, Any]:
        """The last weight-digest check of this rank's engine (``RolloutHost.weight_fact``)."""
        return dict(self._rollout_host().weight_fact)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def actor_weights_digest(self, names: list[str] | None = None) -> dict[str, Any]:
        """``{"names", "digest"}`` of the actor's current weights (:mod:`hybridflow.rollout.weights.digest`; the
        sampled tensors of a sharded actor are gathered: every rank takes part, each returns the same)."""
        from hybridflow.engine.reshard import distinct_state_items
        from hybridflow.rollout.weights.digest import digest_names, weights_digest

        if self.actor_engine is None:
            raise RuntimeError(f"actor_weights_digest needs a role with 'actor' (this worker is {self.role!r})")
        state = dict(distinct_state_items(self.actor_engine.module))
        names = list(names) if names is not None else digest_names(
            k for k, v in state.items() if torch.is_floating_point(v))
        return {"names": names, "digest": weights_digest(state, names)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def abort_rollout(self) -> None:
        """Interrupt this rank's in-flight requests (they return with finish_reason 'abort')."""
        self._rollout_host().abort()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def interrupt_rollout(self) -> int:
        """Stop generating for an update; in-flight requests continue after ``resume_rollout`` (V1 colocate)."""
        return self._rollout_host().interrupt()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def resume_rollout(self) -> None:
        self._rollout_host().resume()

    # ------------------------------------------------------------------ weight sync (split placement)
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_actor_weights(self) -> dict[str, torch.Tensor]:
        """Full CPU weights of the actor (on rank 0; ``{}`` on other ranks of a sharded group).

        Only needed when the rollout runs in another worker group; the colocated hybrid engine
        generates with the actor's own module and never copies weights.
        """
        if self.actor is None:
            raise RuntimeError(f"get_actor_weights needs a role with 'actor' (this worker is {self.role!r})")
        return self.actor_engine.full_state_dict()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_actor_weights(self, full: bool = False) -> dict[str, Any]:
        """Rank 0: ``{"tensors": {name: full CPU tensor}, "stats": TransferStats}`` of the actor's tensors that changed
        since the last committed export (all with ``full``), grouped as vLLM loads them (LoRA: the adapter only);
        ``{}`` on the other ranks, which take part in the gathers.  Feeds standalone vLLM servers."""
        if self.actor is None:
            raise RuntimeError(f"export_actor_weights needs a role with 'actor' (this worker is {self.role!r})")
        state = self.actor_engine.full_state_dict()
        if self.rank != 0:
            return {}
        tracker = getattr(self, "_export_delta", None)
        if tracker is None:
            from hybridflow.rollout.weights.delta import DeltaTracker, lora_group, vllm_load_group

            enabled = bool((self.config.rollout.checkpoint_engine.engine_kwargs or {}).get("delta", True))
            tracker = self._export_delta = DeltaTracker(enabled, lora_group if self._lora else vllm_load_group)
        tensors = dict(tracker.select(state.items(), full))
        return {"tensors": tensors, "stats": tracker.stats}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def commit_actor_weights(self, verified: bool) -> None:
        tracker = getattr(self, "_export_delta", None)
        if tracker is not None:
            tracker.commit() if verified else tracker.forget()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_rollout_weights(self, state_dict: dict[str, torch.Tensor]) -> float:
        """Load full weights (as ``get_actor_weights`` returns them) into a rollout-only worker.

        With several ranks only rank 0's dict needs to hold the tensors: they are broadcast from it
        into each rank's shards.  Returns the seconds spent (``timing_s/update_weights``).
        """
        if self._is_actor:
            raise RuntimeError("this worker trains the actor; its rollout already uses the actor's weights")
        start = time.perf_counter()
        engine = self.actor_engine
        if engine.is_sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(engine.module, state_dict, options=options)
        else:
            engine.module.load_state_dict(state_dict)
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_sync_address(self) -> tuple[str, int] | None:
        """Where rank 0 will listen for the weight-sync group of standalone rollout replicas."""
        if self.rank != 0:
            return None
        from hybridflow.rollout.weights.checkpoint_engine import free_port, node_address

        return node_address(), free_port()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def connect_weight_sync(self, spec) -> None:
        """Rank 0 joins the weight-sync group as its sender (blocks until every replica has joined)."""
        if self.actor is None:
            raise RuntimeError(f"connect_weight_sync needs a role with 'actor' (this worker is {self.role!r})")
        if self.rank == 0:
            from hybridflow.rollout.weights.checkpoint_engine import BroadcastCheckpointEngine
            from hybridflow.rollout.weights.delta import DeltaTracker

            self._weight_sync = BroadcastCheckpointEngine(spec, 0, self.device).connect()
            self._weight_delta = DeltaTracker(enabled=getattr(spec, "delta", True))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def send_rollout_weights(self, full: bool = False) -> dict[str, float]:
        """Broadcast the actor's weights to the replicas, bucket by bucket (every rank gathers its shards; rank 0
        sends): the tensors that changed since the last verified sync, or all of them with ``full``.  Returns
        what was sent (``TransferStats.as_floats()``; ``{}`` on the other ranks)."""
        from hybridflow.rollout.weights.checkpoint_engine import full_tensors

        if self.actor is None:
            raise RuntimeError(f"send_rollout_weights needs a role with 'actor' (this worker is {self.role!r})")
        tensors = full_tensors(self.actor_engine.module)
        if self.rank != 0:
            for _ in tensors:  # the gathers are collectives: every rank takes part
                pass
            return {}
        sync = self._weight_sync
        if sync is None:
            raise RuntimeError("send_rollout_weights: connect_weight_sync has not run on rank 0")
        stats = sync.send_weights(tensors, delta=self._weight_delta, full=full)
        return stats.as_floats()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def commit_rollout_weights(self, verified: bool) -> None:
        """The replicas checked every bucket of the last sync (``verified``): it becomes the base of the next
        delta; otherwise the next sync compares against nothing."""
        delta = getattr(self, "_weight_delta", None)
        if delta is not None:
            delta.commit() if verified else delta.forget()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_checksum(self) -> float:
        """Sum of all actor parameters (tests compare it with the replicas')."""
        from hybridflow.rollout.weights.checkpoint_engine import full_tensors

        with torch.no_grad():
            return float(sum(t.double().sum() for _, t in full_tensors(self.actor_engine.module)
                             if t.is_floating_point()))

    # ------------------------------------------------------------------ log-probs
    def _temperature(self, data: DataProto) -> float:
        return float(data.meta_info.get("temperature", self.config.rollout.temperature))

    def _log_prob_spec(self, node: Any, field: str) -> MicroBatchSpec:
        return MicroBatchSpec(
            use_dynamic_bsz=bool(node.log_prob_use_dynamic_bsz),
            micro_batch_size=node.log_prob_micro_batch_size_per_gpu,
            max_token_len=int(node.log_prob_max_token_len_per_gpu),
            field=f"{field}.log_prob_micro_batch_size_per_gpu",
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_actor_weights(self, name: str) -> None:
        """Keep a CPU copy of this rank's actor parameters (its shards) under ``name`` (V1 separate_async:
        pi_old of a weight version, for the version's later mini-batches)."""
        if self.actor is None:
            raise RuntimeError(f"save_actor_weights needs a role with 'actor' (this worker is {self.role!r})")
        with torch.no_grad():
            self._saved_weights = getattr(self, "_saved_weights", {})
            self._saved_weights[name] = [_local(p).detach().to("cpu", copy=True)
                                         for p in self.actor_engine.module.parameters()]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def drop_actor_weights(self, name: str) -> None:
        getattr(self, "_saved_weights", {}).pop(name, None)

    def _weights_named(self, name: str | None):
        """Context: the actor's parameters replaced by the copy saved under ``name`` (restored after)."""
        import contextlib

        if not name:
            return contextlib.nullcontext()
        saved = getattr(self, "_saved_weights", {}).get(name)
        if saved is None:
            raise RuntimeError(f"no actor weights saved under {name!r} (save_actor_weights must run first)")

        @contextlib.contextmanager
        def swapped():
            params = [_local(p) for p in self.actor_engine.module.parameters()]
            with torch.no_grad():
                current = [p.detach().to("cpu", copy=True) for p in params]
                for p, s in zip(params, saved):
                    p.copy_(s)
            try:
                yield
            finally:
                with torch.no_grad():
                    for p, c in zip(params, current):
                        p.copy_(c)

        return swapped()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` of the responses under the current actor (temperature-scaled),
        plus ``sum_pi_squared`` (Σ_v π², the Optimal Token Baseline's input) with
        ``actor.calculate_sum_pi_squared=true``."""
        if self.actor is None:
            raise RuntimeError(f"compute_log_prob needs a role with 'actor' (this worker is {self.role!r})")
        temperature = self._temperature(data)
        spec = self._log_prob_spec(self.config.rollout, "actor_rollout_ref.rollout")
        with self._weights_named(data.meta_info.get(PI_OLD_WEIGHTS)):
            outs = self.actor.compute_log_prob(data, spec, temperature, calculate_entropy=True,
                                               calculate_sum_pi_squared=bool(self.config.actor.calculate_sum_pi_squared))
        # The trainer turns these into actor/entropy and training/rollout_probs_diff_* for the whole batch.
        tensors = {"old_log_probs": outs["log_probs"], "entropys": outs["entropy"]}
        if "sum_pi_squared" in outs:
            tensors["sum_pi_squared"] = outs["sum_pi_squared"]
        return DataProto.from_dict(tensors, meta_info={"temperature": temperature})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob``: the frozen reference model, or the LoRA actor with adapters disabled."""
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob needs a role with 'ref' (this worker is {self.role!r})")
        temperature = self._temperature(data)
        spec = self._log_prob_spec(self.config.ref, "actor_rollout_ref.ref")
        use_rmpad = self.config.model.use_remove_padding
        compile_ = bool(self.config.ref.use_torch_compile)
        if wants_topk(data) and self.ref_engine is not None:  # a distillation teacher asked for its top-k tokens
            outs = compute_topk_outputs(self.ref_engine, data, spec, temperature, wants_topk(data), use_rmpad)
            return DataProto.from_dict({"ref_log_prob": outs["log_probs"], "ref_topk_log_probs": outs["topk_log_probs"],
                                        "ref_topk_ids": outs["topk_ids"]}, meta_info={"temperature": temperature})
        if self.ref_engine is None:  # LoRA: the base model is the actor without its adapters
            with self.actor_engine.module.disable_adapter():
                log_probs = compute_token_outputs(self.actor_engine, data, spec, temperature, False, use_rmpad,
                                                  use_torch_compile=compile_)["log_probs"]
        else:
            log_probs = compute_token_outputs(self.ref_engine, data, spec, temperature, False, use_rmpad,
                                              use_torch_compile=compile_)["log_probs"]
        return DataProto.from_dict({"ref_log_prob": log_probs}, meta_info={"temperature": temperature})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def refresh_reference(self) -> float:
        """The reference takes the actor's current weights (``trainer.ref_update_freq``); seconds spent.

        Both models are sharded the same way over the same ranks, so each rank copies its own shards."""
        if self.ref_engine is None or self.actor_engine is None or self.actor is None:
            raise RuntimeError("refresh_reference needs the actor and a reference model of its own in this worker "
                               f"(role {self.role!r}, LoRA reference: {self.ref_engine is None})")
        start = time.perf_counter()
        actor_params = dict(self.actor_engine.module.named_parameters())
        ref_params = dict(self.ref_engine.module.named_parameters())
        if actor_params.keys() != ref_params.keys():
            missing = sorted(set(actor_params) ^ set(ref_params))[:3]
            raise ValueError(f"trainer.ref_update_freq: the reference model ({self.config.ref.model or 'the actor start'}) "
                             f"does not have the actor's parameters (first differences: {missing}); refresh only a "
                             "reference of the actor's architecture")
        with torch.no_grad(), self.actor_engine.on_device(), self.ref_engine.on_device():
            for name, param in actor_params.items():
                ref_params[name].data.copy_(param.data)
        return time.perf_counter() - start

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update_actor_dpo(self, data: DataProto) -> DataProto:
        """SPIN's DPO update on pair-ordered rows (``workers/dpo_actor.py``); metrics in ``meta_info``."""
        from hybridflow.workers.dpo_actor import update_policy_dpo

        if self.actor is None:
            raise RuntimeError(f"update_actor_dpo needs a role with 'actor' (this worker is {self.role!r})")
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        start = time.perf_counter()
        metrics: dict[str, Any] = update_policy_dpo(self.actor, data)
        metrics["perf/update_actor_s"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update on this rank's share; metrics in ``meta_info["metrics"]`` (verl names)."""
        if self.actor is None:
            raise RuntimeError(f"update_actor needs a role with 'actor' (this worker is {self.role!r})")
        data.meta_info.setdefault("temperature", self.config.rollout.temperature)
        start = time.perf_counter()
        with self.actor_engine.sequence_parallel_traffic("actor") as traffic:
            metrics: dict[str, Any] = self.actor.update_policy(data)
        metrics.update(traffic)
        metrics["perf/update_actor_s"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        """Save the actor's shards under ``local_path`` (``global_step_N/actor``).

        Keeping only the last ``max_ckpt_to_keep`` step folders is done by the trainer, which owns
        the ``global_step_N`` directories; the argument is accepted for verl's call signature.
        """
        engine = self._checkpoint_engine()
        save_engine_checkpoint(
            engine, local_path, self.tokenizer, self.config.actor.checkpoint.save_contents,
            field="actor_rollout_ref.actor.checkpoint.save_contents", processor=self.processor,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        engine = self._checkpoint_engine()
        load_engine_checkpoint(
            engine, local_path, self.config.actor.checkpoint.load_contents,
            field="actor_rollout_ref.actor.checkpoint.load_contents", strict=bool(self.config.actor.checkpoint.strict),
        )

    def _checkpoint_engine(self) -> TrainEngine:
        if self.actor_engine is None or self.actor is None:
            raise RuntimeError(f"checkpoints are saved by the actor; this worker's role is {self.role!r}")
        return self.actor_engine
