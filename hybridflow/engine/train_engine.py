"""``TrainEngine``: one role's model + optimizer + LR schedule over the data-parallel group.

The role workers (actor, critic, ref, reward model) only speak to this object: they hand it
micro-batch losses and ask it to step, to gather weights, to offload between phases and to
save/load checkpoints.  It hides whether the module is FSDP2-sharded over N ranks or a plain
module in a single process (the local backend, where torch.distributed is not initialised),
and how the ranks are laid out (``engine/parallel_dims.py``: pipeline x data parallel x Ulysses sequence parallel x
tensor parallel, with expert parallelism inside data parallelism): workers read ``dp_size`` / ``dp_rank`` for their
share of the batch and pass ``sequence_parallel`` to the forward functions, whatever the mesh; with pipeline
parallelism they run their passes through ``pipeline`` (a :class:`~hybridflow.engine.parallel.pipeline.
PipelineRunner`). How the dimensions are applied, and in which order, is ``engine/parallel/parallelize.py``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.engine import device as dev
from hybridflow.engine.fsdp import (
    clip_gradients,
    full_params,
    full_state_dict,
    is_distributed,
    move_module,
    move_optimizer_state,
)
from hybridflow.engine.optim import build_lr_scheduler, build_optimizer
from hybridflow.engine.parallel.parallelize import PipelineSpec, parallelize
from hybridflow.engine.parallel.pipeline_forward import PipelinePass, pipeline_outputs, pipeline_train
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.reshard import pipeline_full_tensors
from hybridflow.engine.ulysses_forward import SequenceParallel
from hybridflow.utils.host_memory import keep_freed_host_memory

if TYPE_CHECKING:
    from hybridflow.config.schema import FSDPConfig, OptimConfig

__all__ = ["TrainEngine", "StepResult", "resolve_precision"]


def resolve_precision(fsdp_config: FSDPConfig, role: str) -> tuple[torch.dtype, torch.dtype, torch.dtype | None]:
    """(compute, gradient-reduce, buffer) dtypes of a role's engine.

    ``fsdp_config.mixed_precision`` (verl's keys) wins where set: ``param_dtype`` is the compute dtype of the
    unsharded parameters, ``reduce_dtype`` the gradient reduction, ``buffer_dtype`` the module's buffers. An
    explicit ``param_dtype`` is honoured on CPU too (FSDP2 all-gathers bf16 over gloo, autocast runs bf16 on
    CPU). Otherwise the compute dtype is ``fsdp_config.dtype`` on GPU and fp32 on CPU -- the default
    ``dtype: bfloat16`` is a GPU setting, and CPU has no fast bf16 -- with fp32 reduction and buffers as loaded.
    """
    mp = fsdp_config.mixed_precision
    key = f"{role}.fsdp_config"
    if mp.param_dtype is not None:
        compute = dev.resolve_dtype(mp.param_dtype, f"{key}.mixed_precision.param_dtype")
    elif dev.is_cuda():
        compute = dev.resolve_dtype(fsdp_config.dtype, f"{key}.dtype")
    else:
        compute = torch.float32
    reduce = torch.float32 if mp.reduce_dtype is None else dev.resolve_dtype(mp.reduce_dtype, f"{key}.mixed_precision.reduce_dtype")
    buffers = None if mp.buffer_dtype is None else dev.resolve_dtype(mp.buffer_dtype, f"{key}.mixed_precision.buffer_dtype")
    return compute, reduce, buffers


@dataclass
class StepResult:
    """Outcome of one optimizer step: the pre-clip gradient norm and whether the step was applied."""

    grad_norm: float
    stepped: bool
    lr: float


class TrainEngine:
    """Wrap ``module`` for training (``optim_config`` given) or inference only (``optim_config=None``).

    ``fsdp_config`` is the role's ``fsdp_config`` node (``param_offload``, ``optimizer_offload``,
    ``offload_policy``, ``reshard_after_forward``, ``fsdp_size``, ``dtype``); ``total_training_steps``
    fills the LR schedule's horizon when the config leaves it at -1.  ``parallel_dims``: the role's layout
    (default: every rank data parallel).
    """

    def __init__(
        self,
        module: nn.Module,
        fsdp_config: FSDPConfig,
        optim_config: OptimConfig | None = None,
        total_training_steps: int | None = None,
        role: str = "actor",
        parallel_dims: ParallelDims | None = None,
        activation_offload: bool = False,
        pipeline: PipelineSpec | None = None,
    ):
        self.role = role
        self.fsdp_config = fsdp_config
        self.offload_activations = bool(activation_offload)
        if fsdp_config.full_determinism:  # verl: deterministic kernels (slower), every RNG seeded from fsdp seed
            from transformers import enable_full_determinism

            enable_full_determinism(int(fsdp_config.seed))
        self.device = dev.get_device()
        if self.device.type == "cpu":  # activations live in host memory: keep it for the next micro-batch
            keep_freed_host_memory()
        world = dist.get_world_size() if is_distributed() else 1
        self.parallel_dims = (parallel_dims if parallel_dims is not None else ParallelDims(world)).build(dev.device_type())
        self._rank = dist.get_rank() if is_distributed() and self.parallel_dims.world > 1 else 0
        self.mesh = self.parallel_dims.fsdp_mesh(dev.device_type(), fsdp_config.fsdp_size)
        self.compute_dtype, reduce, buffers = resolve_precision(fsdp_config, role)
        laid_out = parallelize(module, self.parallel_dims, self._rank, self.device, fsdp_config,
                               (self.compute_dtype, reduce, buffers), self.mesh, pipeline)
        self.sequence_parallel: SequenceParallel | None = laid_out.sequence_parallel
        self.pipeline = laid_out.pipeline  # pp > 1: runs passes of micro-batches through this rank's stages
        self.tied_embedding = laid_out.tied_embedding
        module = laid_out.module
        self.module = module
        self.optimizer = None
        self.lr_scheduler = None
        if optim_config is not None:
            self.optimizer = build_optimizer(module.parameters(), optim_config, f"{role}.optim")
            total = optim_config.total_training_steps if total_training_steps is None else total_training_steps
            self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_config, total, f"{role}.optim")
        self.param_offload = bool(fsdp_config.param_offload)
        self.optimizer_offload = bool(fsdp_config.optimizer_offload) and self.optimizer is not None
        self._params_on_device = True
        self._optimizer_on_device = True
        if self.param_offload:
            self.offload_params()
        if self.optimizer_offload:
            self.offload_optimizer()

    # ------------------------------------------------------------------ layout
    @property
    def dp_size(self) -> int:
        """Data-parallel groups: how many different chunks of a batch are processed at once."""
        return self.parallel_dims.dp

    @property
    def dp_rank(self) -> int:
        return self.parallel_dims.dp_rank(self._rank)

    @property
    def rank(self) -> int:
        """This process's rank in the group (the shard index of checkpoints)."""
        return self._rank

    @property
    def world_size(self) -> int:
        return self.parallel_dims.world

    @property
    def is_sharded(self) -> bool:
        return self.mesh is not None

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        """Sum a few scalars over the DP group (the global loss normalisers); sp peers hold the same rows and
        are not counted twice."""
        if self.dp_size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.parallel_dims.dp_group)
        return t.tolist()

    def all_reduce_max(self, values: list[float]) -> list[float]:
        """Element-wise maximum of a few scalars over the DP group."""
        if self.dp_size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.parallel_dims.dp_group)
        return t.tolist()

    # ------------------------------------------------------------------ passes over micro-batches
    def forward_passes(self, batches: list[dict[str, torch.Tensor]], spec: PipelinePass,
                       run_one: Callable[[int], dict[str, torch.Tensor]]) -> list[dict]:
        """Each micro-batch's outputs: ``run_one(i)`` one after another, or, with pipeline parallelism, all of them
        through the stages together (``spec``: the same head; real outputs on the last stage's ranks, zeros of the
        same shape elsewhere -- the controller collects the last stage's)."""
        if self.pipeline is None:
            return [run_one(i) for i in range(len(batches))]
        return pipeline_outputs(self.pipeline, batches, spec)

    def backward_passes(self, batches: list[dict[str, torch.Tensor]], spec: PipelinePass,
                        run_one: Callable[[int], dict[str, torch.Tensor]],
                        loss: Callable[[dict[str, torch.Tensor], int], torch.Tensor]) -> None:
        """Forward and backward of every micro-batch: ``loss(run_one(i), i).backward()`` one after another, or the
        stages' schedule with the same head and ``loss`` on the last stage (gradients accumulate)."""
        if self.pipeline is None:
            for i in range(len(batches)):
                loss(run_one(i), i).backward()
            return
        pipeline_train(self.pipeline, batches, spec, loss)

    # ------------------------------------------------------------------ optimisation
    def zero_grad(self) -> None:
        self._require_optimizer().zero_grad(set_to_none=True)

    def optimizer_step(self, grad_clip: float | None) -> StepResult:
        """Clip gradients to ``grad_clip`` and step; skip (and report) when the norm is not finite.

        A single inf/nan gradient would corrupt the Adam moments for good, so a non-finite total norm
        zeroes the gradients and leaves weights and optimizer state untouched.
        """
        optimizer = self._require_optimizer()
        params = [p for p in self.module.parameters() if p.requires_grad]
        max_norm = float(grad_clip) if grad_clip is not None and grad_clip > 0 else float("inf")
        skip = self._sum_tied_embedding_gradients()
        if self.parallel_dims.nd:  # parameters on several meshes: the global norm is combined group by group
            grad_norm = clip_gradients(params, max_norm, self.parallel_dims.stage_world, skip)
        else:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
            if hasattr(norm, "full_tensor"):  # DTensor norm of sharded gradients
                norm = norm.full_tensor()
            grad_norm = float(norm.item())
        stepped = math.isfinite(grad_norm)
        if stepped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return StepResult(grad_norm=grad_norm, stepped=stepped, lr=self.current_lr())

    @property
    def tied_head_weight(self) -> str | None:
        """With pipeline parallelism and tied embeddings: the name of the last stage's copy of the embedding
        (``lm_head.weight``), which a rollout engine's model does not hold apart; else ``None``."""
        return f"{self.tied_embedding[1]}.weight" if self.tied_embedding is not None else None

    def _sum_tied_embedding_gradients(self) -> frozenset[int]:
        """Pipeline parallelism with tied input and output embeddings: the first stage's embedding and the last
        stage's head are copies of one weight; their gradients are summed (the tied weight's gradient) so both copies
        take the same step. Returns the parameter the global norm must not count twice (the head's copy)."""
        group = self.parallel_dims.tied_embedding_group
        if self.tied_embedding is None or group is None:
            return frozenset()
        emb_name, head_name = self.tied_embedding
        first = self.parallel_dims.pp_rank(self._rank) == 0
        param = self.module.get_submodule(emb_name if first else head_name).weight
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grad = param.grad
        dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)
        return frozenset() if first else frozenset({id(param)})

    def lr_scheduler_step(self) -> float:
        """Advance the schedule by one training step; returns the LR used for the step just taken."""
        lr = self.current_lr()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        return lr

    def current_lr(self) -> float:
        optimizer = self._require_optimizer()
        return float(optimizer.param_groups[0]["lr"])

    def _require_optimizer(self):
        if self.optimizer is None:
            raise RuntimeError(f"the {self.role} engine was built without an optimizer (inference only)")
        return self.optimizer

    def autocast(self):
        """Compute-dtype context for forward passes of an *unsharded* module.

        A sharded module computes in ``compute_dtype`` through FSDP's mixed-precision policy; a
        single-process module (the local backend) gets the same through autocast.  With an fp32 compute
        dtype (CPU unless ``mixed_precision.param_dtype`` asks otherwise) this is a no-op.
        """
        if self.is_sharded or self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=dev.device_type(), dtype=self.compute_dtype)

    @contextlib.contextmanager
    def sequence_parallel_traffic(self, role: str) -> Iterator[dict[str, float]]:
        """Measure the bytes this rank's Ulysses collectives sent inside the block; the dict it yields gets
        ``perf/{role}_sp_comm_mb`` at exit (stays empty without sequence parallelism).  Calls on one process run
        one after another, so the process-wide counter is this engine's while the block runs."""
        out: dict[str, float] = {}
        if self.sequence_parallel is None:
            yield out
            return
        from hybridflow.engine.ulysses import COMM

        COMM.reset()
        try:
            yield out
        finally:
            out[f"perf/{role}_sp_comm_mb"] = COMM.total() / 2**20

    def activation_offload(self):
        """``model.enable_activation_offload``: tensors saved for backward go to pinned host memory during the
        forward and come back for the backward (``torch.autograd.graph.save_on_cpu``), trading PCIe transfers
        for GPU memory.  On CPU the activations already live in host memory, so this is a no-op there."""
        if not self.offload_activations or not dev.is_cuda():
            return contextlib.nullcontext()
        return torch.autograd.graph.save_on_cpu(pin_memory=True)

    # ------------------------------------------------------------------ offload between phases
    def offload_params(self) -> None:
        move_module(self.module, "cpu")
        self._params_on_device = False
        dev.empty_cache()

    def load_params(self) -> None:
        move_module(self.module, self.device)
        self._params_on_device = True

    def offload_optimizer(self) -> None:
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, "cpu")
            self._optimizer_on_device = False
            dev.empty_cache()

    def load_optimizer(self) -> None:
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, self.device)
            self._optimizer_on_device = True

    @contextlib.contextmanager
    def on_device(self, with_optimizer: bool = False) -> Iterator[None]:
        """Bring offloaded weights (and optimizer state) to the device for one phase, then offload again."""
        load_p = self.param_offload and not self._params_on_device
        load_o = with_optimizer and self.optimizer_offload and not self._optimizer_on_device
        if load_p:
            self.load_params()
        if load_o:
            self.load_optimizer()
        try:
            yield
        finally:
            if load_o:
                self.offload_optimizer()
            if load_p:
                self.offload_params()

    # ------------------------------------------------------------------ weights
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full CPU weights (rank 0 of a sharded group; ``{}`` on other ranks).  With pipeline parallelism every
        stage's tensors travel to rank 0 one at a time (``engine/reshard.py: pipeline_full_tensors``)."""
        with self.on_device():
            if self.pipeline is None:
                return full_state_dict(self.module)
            tensors = pipeline_full_tensors(self.module, "raw", self.parallel_dims.pp_group)
            if self.rank != 0:
                for _ in tensors:  # every rank takes part in the gathers and broadcasts
                    pass
                return {}
            return {name: t.detach().to("cpu", copy=True) for name, t in tensors}

    @contextlib.contextmanager
    def full_params(self) -> Iterator[nn.Module]:
        """The module with all parameters unsharded on every rank (for generation)."""
        with self.on_device(), full_params(self.module) as module:
            yield module
