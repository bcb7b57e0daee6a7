"""The PPO critic: per-token values and the clipped value-regression update.

``CriticWorker(config: CriticConfig)`` loads the critic as a causal-LM backbone with a scalar head
(``engine/model_loader.load_value_model``), shards it like the actor, and trains it on the
``returns`` of GAE (Schulman et al. 2016, arXiv:1506.02438) with PPO's clipped value loss
(``algorithms/value_loss.compute_value_loss``), normalised by the mini-batch's global token counts.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import torch

from hybridflow.algorithms.aggregation import check_loss_agg_mode, count_loss_normalizers
from hybridflow.algorithms.masked import masked_mean
from hybridflow.algorithms.value_loss import compute_value_loss
from hybridflow.controller import Dispatch, Worker, make_nd_compute_dataproto_dispatch_fn, register
from hybridflow.engine.engine_checkpoint import load_engine_checkpoint, save_engine_checkpoint
from hybridflow.engine.forward import response_values, values_pass
from hybridflow.engine.dist_checkpoint import start_from_dist_checkpoint
from hybridflow.engine.lora_options import LoraOptions
from hybridflow.engine.activation_memory import act_on, decide_for_role
from hybridflow.engine.model_loader import apply_lora, load_tokenizer, load_value_model
from hybridflow.engine.parallel.parallelize import pipeline_spec_for
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.protocol import DataProto
from hybridflow.workers.micro_batching import (
    MicroBatchSpec,
    gather_in_order,
    normalize_mini_batch_size,
    split_micro_batches,
)

if TYPE_CHECKING:
    from hybridflow.config.schema import CriticConfig

__all__ = ["CriticWorker", "PPOCritic"]

_MODEL_KEYS = ("responses", "input_ids", "attention_mask", "position_ids")


class PPOCritic:
    """Value computation and update over a ``TrainEngine`` (``config`` is a ``CriticConfig``)."""

    def __init__(self, config: CriticConfig, engine: TrainEngine):
        self.config = config
        self.engine = engine
        check_loss_agg_mode(config.loss_agg_mode)
        self.use_remove_padding = bool(config.model.use_remove_padding)
        self.mini_batch_size = normalize_mini_batch_size(
            config.ppo_mini_batch_size, config.rollout_n, engine.dp_size, "critic.ppo_mini_batch_size"
        )
        self.update_spec = MicroBatchSpec(
            bool(config.use_dynamic_bsz), config.ppo_micro_batch_size_per_gpu,
            int(config.ppo_max_token_len_per_gpu), "critic.ppo_micro_batch_size_per_gpu",
        )
        self.forward_spec = MicroBatchSpec(
            bool(config.use_dynamic_bsz), config.forward_micro_batch_size_per_gpu,
            int(config.forward_max_token_len_per_gpu), "critic.forward_micro_batch_size_per_gpu",
        )

    def compute_values(self, data: DataProto) -> torch.Tensor:
        module = self.engine.module
        micro_batches, parts = split_micro_batches(data.select(batch_keys=list(_MODEL_KEYS)), self.forward_spec,
                                                   sp=self.engine.parallel_dims.sp)
        batches = [mb.batch.to(self.engine.device) for mb in micro_batches]
        module.eval()
        with torch.no_grad(), self.engine.on_device(), self.engine.autocast():
            outs = self.engine.forward_passes(batches, self._values_pass(data), lambda i: self._values(batches[i]))
        return gather_in_order([o["values"].cpu() for o in outs], parts) * data.batch["response_mask"]

    def _values(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"values": response_values(self.engine.module, batch, self.use_remove_padding,
                                          sequence_parallel=self.engine.sequence_parallel)}

    def _values_pass(self, data: DataProto):
        return values_pass(self.engine.module, data.batch["responses"].shape[-1], self.use_remove_padding,
                           sequence_parallel=self.engine.sequence_parallel)

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        cfg = self.config
        batch = data.select(batch_keys=list(_MODEL_KEYS) + ["response_mask", "values", "returns"])
        metrics: dict[str, list[float]] = defaultdict(list)
        self.engine.module.train()
        with self.engine.on_device(with_optimizer=True):
            for epoch in range(int(cfg.ppo_epochs)):
                batch_e = batch
                if cfg.shuffle:
                    gen = torch.Generator().manual_seed(int(cfg.data_loader_seed) * 1009 + epoch)
                    batch_e = batch.select_idxs(torch.randperm(len(batch), generator=gen))
                for mini_batch in batch_e.split(self.mini_batch_size):
                    self._train_mini_batch(mini_batch, metrics)
        metrics["critic/lr"].append(self.engine.lr_scheduler_step())
        return dict(metrics)

    def _train_mini_batch(self, mini_batch: DataProto, metrics: dict[str, list[float]]) -> None:
        cfg = self.config
        micro_batches, _ = split_micro_batches(mini_batch, self.update_spec, sp=self.engine.parallel_dims.sp)
        tokens = sum(count_loss_normalizers(mb.batch["response_mask"])["global_token_num"] for mb in micro_batches)
        seqs = sum(count_loss_normalizers(mb.batch["response_mask"])["global_batch_size"] for mb in micro_batches)
        tokens, seqs = self.engine.all_reduce_sum([float(tokens), float(seqs)])
        norm = {"global_token_num": int(tokens), "global_batch_size": int(seqs), "dp_size": self.engine.dp_size}
        if cfg.loss_scale_factor is not None:  # seq-mean-token-sum-norm's constant (verl: follows the actor's)
            norm["loss_scale_factor"] = float(cfg.loss_scale_factor)
        self.engine.zero_grad()
        vf_loss_sum, clipfracs, vpred_means = 0.0, [], []
        batches = [mb.batch.to(self.engine.device) for mb in micro_batches]

        def loss(out: dict[str, torch.Tensor], i: int) -> torch.Tensor:
            nonlocal vf_loss_sum
            b, vpreds = batches[i], out["values"]
            mask = b["response_mask"]
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, b["returns"], b["values"], mask, float(cfg.cliprange_value), cfg.loss_agg_mode, **norm
            )
            vf_loss_sum += float(vf_loss.detach())
            if bool(mask.any()):  # a micro-batch of padding rows only has no statistics to average in
                clipfracs.append(float(vf_clipfrac))
                vpred_means.append(float(masked_mean(vpreds.detach(), mask)))
            return vf_loss

        with self.engine.autocast(), self.engine.activation_offload():
            self.engine.backward_passes(batches, self._values_pass(mini_batch), lambda i: self._values(batches[i]), loss)
        step = self.engine.optimizer_step(cfg.grad_clip)
        metrics["critic/vf_loss"].append(vf_loss_sum)
        metrics["critic/vf_clipfrac"].append(sum(clipfracs) / max(len(clipfracs), 1))
        metrics["critic/vpred_mean"].append(sum(vpred_means) / max(len(vpred_means), 1))
        metrics["critic/grad_norm"].append(step.grad_norm)
        metrics["critic/nonfinite_grad_skipped"].append(0.0 if step.stepped else 1.0)


class CriticWorker(Worker):
    """``@register``-ed critic role: ``init_model``, ``compute_values``, ``update_critic``, checkpoints."""

    def __init__(self, config: CriticConfig):
        super().__init__()
        self.config = config
        self._dims = ParallelDims.for_role(self.world_size, config, "critic")
        self._register_dispatch_collect_info("critic", dp_rank=self._dims.dp_rank(self.rank),
                                             is_collect=self._dims.is_collect(self.rank))
        self.engine: TrainEngine | None = None
        self.critic: PPOCritic | None = None
        self.tokenizer = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None, max_seq_len: int | None = None) -> None:
        """Load, shard and build the critic. ``max_seq_len`` (the data's prompt + response length, which the critic's
        config does not carry) bounds a micro-batch for the activation checkpointing decision; without it the
        token budget ``ppo_max_token_len_per_gpu`` does."""
        if self.world_size > 1:  # joined here: every rank exists once init_model runs
            self.init_distributed()
        mc = self.config.model
        if mc.external_lib:
            from hybridflow.utils.load_object import import_source

            import_source(mc.external_lib, key="critic.model.external_lib")
        self.tokenizer = load_tokenizer(
            mc.tokenizer_path or mc.path, mc.trust_remote_code, require_chat_template=False,
            field="critic.model.tokenizer_path",
        )
        torch.manual_seed(int(mc.fsdp_config.seed))
        module = load_value_model(mc.path, mc.fsdp_config.model_dtype, mc.trust_remote_code, mc.override_config)
        start_from_dist_checkpoint(module, self.config, "critic", keep=("score.",))  # the value head stays its own
        if int(mc.lora_rank) > 0:
            module = apply_lora(module, mc.lora_rank, mc.lora_alpha, mc.target_modules, task_type="TOKEN_CLS",
                                options=LoraOptions.from_node(mc.lora))
        self.activation_checkpointing = act_on(decide_for_role(
            module, mc.enable_gradient_checkpointing, "critic.model.enable_gradient_checkpointing", self.config,
            mc.fsdp_config, sequence=max_seq_len, device=self.device.type, dims=self._dims), module, "critic",
            announce=self.rank == 0)
        self.engine = TrainEngine(module, mc.fsdp_config, self.config.optim, total_training_steps, role="critic",
                                  parallel_dims=self._dims, activation_offload=bool(mc.enable_activation_offload),
                                  pipeline=pipeline_spec_for(self.config))
        self.critic = PPOCritic(self.config, self.engine)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): V of the state before each response token (0 on padding)."""
        return DataProto.from_dict({"values": self.critic.compute_values(data)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        start = time.perf_counter()
        with self.engine.sequence_parallel_traffic("critic") as traffic:
            metrics: dict[str, Any] = self.critic.update_critic(data)
        metrics.update(traffic)
        metrics["perf/update_critic_s"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0, max_ckpt_to_keep: int | None = None) -> None:
        """Save under ``global_step_N/critic`` (step-folder rotation is the trainer's job)."""
        save_engine_checkpoint(self.engine, local_path, self.tokenizer, self.config.checkpoint.save_contents,
                               field="critic.checkpoint.save_contents")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        load_engine_checkpoint(self.engine, local_path, self.config.checkpoint.load_contents,
                               field="critic.checkpoint.load_contents")
