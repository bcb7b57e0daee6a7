"""PRIME's implicit process reward model as a worker role: score (``compute_rm_score``) and train online
(``update_rm``) -- its own update step in the dataflow (Cui et al. 2025, arXiv:2502.01456; verl-recipe ``prime``).

The PRM π_φ is a causal LM (``reward_model.model.path``, usually the policy's own starting checkpoint) trained with
an optimiser of its own (``reward_model.model.optim``); its frozen reference π_ref is ``reward_model.model.ref_path``
(default: the PRM's starting checkpoint).  Both read the policy's token ids, so their tokenizer must have the
policy's vocabulary (checked at start).  For each response token the worker returns

* ``process_rewards`` = β·(log π_φ − log π_ref) on valid tokens (``prime_granularity=token``) or their sum on the
  last valid token (``whole``), before PRIME's batch normalisation (done on the controller over the whole batch);
* ``prm_q`` = log π_φ − log π_ref (for the metrics).

``update_rm`` trains π_φ on the outcome labels ``acc`` with PRIME's cross-entropy (``algorithms/prime.py``):
mini-batches of ``reward_model.mini_batch_size`` prompts' samples, micro-batches of
``reward_model.micro_batch_size_per_gpu`` rows, the loss summed over rows and divided by the mini-batch's row count
over all ranks (split-invariant), clipped at ``optim.grad_clip``.  It returns the process rewards of its own
forward passes, each taken just before its mini-batch's optimiser step (verl-recipe's ``update=after``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from hybridflow.algorithms.prime import compute_ce_dpo_loss_rm, implicit_process_rewards
from hybridflow.controller import Dispatch, Worker, make_nd_compute_dataproto_dispatch_fn, register
from hybridflow.engine.activation_memory import act_on, decide_for_module
from hybridflow.engine.device import resolve_dtype
from hybridflow.engine.engine_checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.engine.forward import response_log_probs
from hybridflow.engine.model_loader import load_causal_lm, load_tokenizer
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.protocol import DataProto
from hybridflow.workers.actor import compute_token_outputs
from hybridflow.workers.micro_batching import (
    MicroBatchSpec,
    gather_in_order,
    normalize_mini_batch_size,
    split_micro_batches,
)

if TYPE_CHECKING:
    from hybridflow.config.schema import RewardModelConfig

__all__ = ["PrimeRewardModelWorker"]

_KEYS = ("responses", "input_ids", "attention_mask", "position_ids", "response_mask")


class PrimeRewardModelWorker(Worker):
    """``PrimeRewardModelWorker(config: RewardModelConfig, policy_path)``: ``init_model``, ``compute_rm_score``,
    ``update_rm``, checkpoints (see the module docstring)."""

    def __init__(self, config: RewardModelConfig, policy_path: str):
        super().__init__()
        self.config = config
        self.policy_path = policy_path
        self._dims = ParallelDims(self.world_size, sp=config.ulysses_sequence_parallel_size,
                                  key="reward_model.ulysses_sequence_parallel_size")
        self._register_dispatch_collect_info("reward_model", dp_rank=self._dims.dp_rank(self.rank),
                                             is_collect=self._dims.is_collect(self.rank))
        self.engine: TrainEngine | None = None
        self.ref_engine: TrainEngine | None = None
        self.tokenizer = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> None:
        if self.world_size > 1:
            self.init_distributed()
        mc = self.config.model
        self.tokenizer = load_tokenizer(mc.tokenizer_path or self.policy_path, mc.trust_remote_code,
                                        require_chat_template=False, field="reward_model.model.tokenizer_path")
        prm_tokenizer = load_tokenizer(mc.path, mc.trust_remote_code, require_chat_template=False,
                                       field="reward_model.model.path")
        if prm_tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ValueError(f"reward_model.model.path={mc.path!r}: PRIME's implicit PRM reads the policy's token ids, "
                             f"but its vocabulary differs from the policy's ({self.policy_path!r}); start the PRM from "
                             "a checkpoint of the policy's tokenizer family (usually the policy itself)")
        torch.manual_seed(int(mc.fsdp_config.seed))
        module = load_causal_lm(mc.path, dtype=mc.fsdp_config.model_dtype, trust_remote_code=mc.trust_remote_code,
                                override_config=mc.override_config, field="reward_model.model.path")
        budget = int(self.config.forward_max_token_len_per_gpu)  # its micro-batches' rows are not known here
        self.activation_checkpointing = act_on(decide_for_module(
            module, mc.enable_gradient_checkpointing, "reward_model.model.enable_gradient_checkpointing",
            tokens=budget, sequence=budget, dtype_bytes=resolve_dtype(mc.fsdp_config.model_dtype).itemsize,
            device=self.device.type, dims=self._dims), module, "implicit PRM", announce=self.rank == 0)
        self.engine = TrainEngine(module, mc.fsdp_config, mc.optim, total_training_steps, role="reward_model",
                                  parallel_dims=self._dims)
        ref = load_causal_lm(mc.ref_path or mc.path, dtype=mc.fsdp_config.model_dtype,
                             trust_remote_code=mc.trust_remote_code, override_config=mc.override_config,
                             field="reward_model.model.ref_path")
        ref.requires_grad_(False)
        self.ref_engine = TrainEngine(ref, mc.fsdp_config, None, role="reward_model_ref", parallel_dims=self._dims)

    # ------------------------------------------------------------------ helpers
    def _spec(self, rows: int) -> MicroBatchSpec:
        cfg = self.config
        return MicroBatchSpec(bool(cfg.use_dynamic_bsz), cfg.micro_batch_size_per_gpu or rows,
                              int(cfg.forward_max_token_len_per_gpu), "reward_model.micro_batch_size_per_gpu")

    def _rewards(self, prm_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, mask: torch.Tensor):
        mc = self.config.model
        return implicit_process_rewards(prm_log_prob, ref_log_prob, mask, float(mc.beta_train),
                                        self.config.prime_granularity)

    def _ref_log_probs(self, data: DataProto) -> torch.Tensor:
        return compute_token_outputs(self.ref_engine, data, self._spec(len(data)), 1.0, False,
                                     bool(self.config.model.use_remove_padding))["log_probs"]

    # ------------------------------------------------------------------ score
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("reward_model"))
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``process_rewards`` and ``prm_q`` (B, R) of this rank's rows under the current PRM."""
        inputs = data.select(batch_keys=list(_KEYS))
        use_rmpad = bool(self.config.model.use_remove_padding)
        prm = compute_token_outputs(self.engine, inputs, self._spec(len(inputs)), 1.0, False, use_rmpad)["log_probs"]
        rewards, q = self._rewards(prm, self._ref_log_probs(inputs), inputs.batch["response_mask"])
        return DataProto.from_dict({"process_rewards": rewards, "prm_q": q})

    # ------------------------------------------------------------------ update
    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("reward_model"))
    def update_rm(self, data: DataProto) -> DataProto:
        """Train the PRM on ``acc`` (see the module docstring); returns the process rewards of the update's forward
        passes and ``meta_info["metrics"]``."""
        cfg, engine = self.config, self.engine
        start = time.perf_counter()
        n = int(data.meta_info.get("rollout_n", 1))
        batch = data.select(batch_keys=list(_KEYS) + ["acc"])
        ref_lp = self._ref_log_probs(batch)
        batch.batch["prm_ref_log_prob"] = ref_lp
        mini_rows = normalize_mini_batch_size(cfg.mini_batch_size, n, engine.dp_size, "reward_model.mini_batch_size")
        metrics: dict[str, list[float]] = defaultdict(list)
        rewards, qs = [], []
        engine.module.train()
        with engine.on_device(with_optimizer=True):
            for mini in batch.split(mini_rows):
                r, q = self._train_mini_batch(mini, metrics)
                rewards.append(r)
                qs.append(q)
        metrics["reward_model/lr"].append(engine.lr_scheduler_step())
        metrics["perf/update_reward_model_s"].append(time.perf_counter() - start)
        out = DataProto.from_dict({"process_rewards": torch.cat(rewards), "prm_q": torch.cat(qs)})
        out.meta_info["metrics"] = dict(metrics)
        return out

    def _train_mini_batch(self, mini: DataProto, metrics: dict[str, list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, engine = self.config, self.engine
        micro_batches, parts = split_micro_batches(mini, self._spec(len(mini)), sp=engine.parallel_dims.sp)
        local_rows = sum(int(mb.batch["response_mask"].any(-1).sum()) for mb in micro_batches)
        (rows,) = engine.all_reduce_sum([float(local_rows)])
        engine.zero_grad()
        loss_sum, rewards, qs = 0.0, [], []
        beta = float(cfg.model.beta_train)
        for mb in micro_batches:
            b = mb.batch.to(engine.device)
            mask = b["response_mask"]
            with engine.autocast():
                log_prob, _ = response_log_probs(engine.module, b, 1.0, False, bool(cfg.model.use_remove_padding),
                                                 sequence_parallel=engine.sequence_parallel)
            q = torch.where(mask.bool(), log_prob - b["prm_ref_log_prob"], torch.zeros_like(log_prob))
            has = mask.bool().any(-1)
            per_row = compute_ce_dpo_loss_rm(q, b["acc"], mask, beta, reduction="none")
            loss = torch.where(has, per_row, torch.zeros_like(per_row)).sum() / max(rows, 1.0) * engine.dp_size
            loss.backward()
            loss_sum += float(loss.detach()) / engine.dp_size
            with torch.no_grad():
                r, q_out = self._rewards(log_prob.detach(), b["prm_ref_log_prob"], mask)
            rewards.append(r.float().cpu())
            qs.append(q_out.float().cpu())
        step = engine.optimizer_step(float(cfg.model.optim.grad_clip))
        (total,) = engine.all_reduce_sum([loss_sum])
        metrics["reward_model/dpo_loss"].append(total)
        metrics["reward_model/grad_norm"].append(step.grad_norm)
        return gather_in_order(rewards, parts), gather_in_order(qs, parts)

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        save_engine_checkpoint(self.engine, local_path, self.tokenizer, ["model", "optimizer", "extra"],
                               field="reward_model (PRIME's PRM)")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        load_engine_checkpoint(self.engine, local_path, ["model", "optimizer", "extra"],
                               field="reward_model (PRIME's PRM)")
