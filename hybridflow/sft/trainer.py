"""Supervised fine-tuning with the same model engine as RL (``TrainEngine``): single- and multi-turn, full or LoRA.

``python -m hybridflow.sft.trainer data.train_files=... model.partial_pretrain=... key=value ...``
(also ``hybridflow sft ...`` and verl's module path ``hybridflow.trainer.fsdp_sft_trainer``), with verl's
``sft_trainer.yaml`` key names (:mod:`hybridflow.sft.config`), or ``run_sft(config, rows=...)`` from
Python -- the quickstart uses the latter to warm a random-init model up before GRPO.

Loss: token-mean cross-entropy over assistant tokens of the whole batch, normalised by the batch's total
number of loss tokens so gradient accumulation over micro-batches -- and data parallelism over
``trainer.n_gpus_per_node`` x ``trainer.nnodes`` ranks (FSDP2) -- gives the same gradient as one big batch.
``model.lora_rank`` > 0 trains LoRA adapters only; the exported model has them merged. With ``data.val_files``
the validation loss (``val/loss``) is computed every ``trainer.test_freq`` steps and after the last one.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from hybridflow.engine.forward import next_token_log_probs
from hybridflow.sft.data import (
    SFTExample,
    collate_sft,
    multi_turn_example,
    single_turn_example,
    truncate_example,
)


from hybridflow.sft.config import (  # noqa: F401 - the config API is re-exported from here
    SFTConfig,
    SFTDataConfig,
    SFTModelConfig,
    SFTMultiturnConfig,
    SFTOptimConfig,
    SFTTrainerConfig,
    load_sft_config,
)


# ---------------------------------------------------------------------------------------------- data
def _lookup(value: Any, keys: Sequence[str] | None, where: str, field: str) -> Any:
    """verl's ``data.{prompt,response}_dict_keys``: look the keys up in the column's dict, one after the other."""
    for key in keys or ():
        if hasattr(value, "tolist") and not isinstance(value, (dict, str)):
            value = value.tolist()
        while isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]  # parquet can wrap a struct in a one-element array
        if not isinstance(value, dict) or key not in value:
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise KeyError(f"{where}: data.{field}_dict_keys looks up {key!r}, but the value holds {have}")
        value = value[key]
    return value


def build_examples(rows: Sequence[dict], tokenizer, data: SFTDataConfig) -> list[SFTExample]:
    examples = []
    for i, row in enumerate(rows):
        where = f"SFT row {i}"
        if data.multiturn.enable:
            if data.multiturn.messages_key not in row:
                raise KeyError(f"{where} has no '{data.multiturn.messages_key}' column (data.multiturn.messages_key)")
            ex = multi_turn_example(tokenizer, row[data.multiturn.messages_key], where,
                                    tools=row.get(data.multiturn.tools_key))
        else:
            for key, name in ((data.prompt_key, "prompt_key"), (data.response_key, "response_key")):
                if key not in row:
                    raise KeyError(f"{where} has no '{key}' column (data.{name}); columns: {sorted(row)}")
            prompt = _lookup(row[data.prompt_key], data.prompt_dict_keys, where, "prompt")
            response = _lookup(row[data.response_key], data.response_dict_keys, where, "response")
            ex = single_turn_example(tokenizer, prompt, str(response), where)
        examples.append(truncate_example(ex, data.max_length, data.truncation, where))
    if not examples:
        raise ValueError("the SFT dataset is empty; check data.train_files")
    return examples


def read_sft_rows(files: Any) -> list[dict]:
    from hybridflow.data.io import as_file_list, read_rows

    return [row for f in as_file_list(files, "data.train_files") for row in read_rows(f)]


# ---------------------------------------------------------------------------------------------- engine
def _engine_configs(config: SFTConfig, total_steps: int):
    """The engine's ``fsdp_config`` / ``optim`` nodes, filled from the SFT keys (same engine as RL)."""
    from hybridflow.config.schema import FSDPConfig, OptimConfig, WrapPolicy

    fsdp = FSDPConfig(wrap_policy=WrapPolicy(min_num_params=0), param_offload=False, grad_offload=False,
                      optimizer_offload=False, offload_policy=False, reshard_after_forward=True, fsdp_size=-1,
                      forward_prefetch=False, model_dtype=config.model.dtype, dtype="bf16", use_orig_params=False,
                      seed=config.trainer.seed, full_determinism=False)
    o = config.optim
    optim = OptimConfig(optimizer="AdamW", optimizer_impl="torch.optim", lr=o.lr,
                        lr_warmup_steps_ratio=o.lr_warmup_steps_ratio, lr_warmup_steps=-1,
                        total_training_steps=total_steps, weight_decay=o.weight_decay, betas=list(o.betas),
                        clip_grad=o.clip_grad, min_lr_ratio=o.min_lr_ratio, num_cycles=0.5,
                        lr_scheduler_type=o.lr_scheduler, warmup_style=None, override_optimizer_config=None)
    return fsdp, optim


def sft_loss(module, batch: dict[str, torch.Tensor], num_loss_tokens: int,
             use_remove_padding: bool = False) -> tuple[torch.Tensor, float]:
    """Sum of next-token cross-entropy over loss tokens / ``num_loss_tokens`` of the whole batch.

    The forward is the RL actor's (``engine/forward.py``): ``use_remove_padding`` packs the micro-batch into one
    row (no layer computes a padding token; attention stays within each example), else the padded batch runs
    trimmed to its valid columns."""
    token_loss = -next_token_log_probs(module, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                       use_remove_padding)
    mask = batch["loss_mask"].to(token_loss.dtype)
    total = (token_loss * mask).sum()
    return total / max(num_loss_tokens, 1), float(total.item())


@dataclass
class SFTResult:
    history: list[dict[str, float]]
    hf_dir: str | None
    seconds: float


class SFTTrainer:
    """Mini-batches of ``data.train_batch_size`` examples, micro-batches of ``micro_batch_size_per_gpu``.

    Under torch.distributed every rank holds the same example order and trains on its slice of each
    mini-batch; the loss is normalised by the mini-batch's total loss tokens (all ranks know it) and scaled by
    the rank count, which FSDP's gradient averaging divides out again.
    """

    def __init__(self, config: SFTConfig, tokenizer, examples: list[SFTExample],
                 on_step: Callable[[int, dict[str, float]], None] | None = None,
                 val_examples: list[SFTExample] | None = None):
        from hybridflow.engine.fsdp import is_distributed
        from hybridflow.engine.model_loader import apply_lora, load_causal_lm
        from hybridflow.engine.train_engine import TrainEngine

        self.config = config
        self.tokenizer = tokenizer
        self.examples = examples
        self.val_examples = list(val_examples or [])
        self.on_step = on_step
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
        bsz = config.data.train_batch_size
        if bsz <= 0 or config.data.micro_batch_size_per_gpu <= 0:
            raise ValueError("data.train_batch_size and data.micro_batch_size_per_gpu must be positive")
        if bsz % self.world:
            raise ValueError(f"data.train_batch_size={bsz} must divide over the {self.world} data-parallel ranks "
                             "(trainer.n_gpus_per_node x trainer.nnodes)")
        self.steps_per_epoch = max(len(examples) // bsz, 1)
        total = config.trainer.total_training_steps or self.steps_per_epoch * config.trainer.total_epochs
        self.total_steps = int(total)
        fsdp, optim = _engine_configs(config, self.total_steps)
        module = load_causal_lm(config.model.partial_pretrain, dtype=config.model.dtype,
                                trust_remote_code=config.model.trust_remote_code, field="model.partial_pretrain")
        if config.model.lora_rank > 0:
            module = apply_lora(module, config.model.lora_rank, config.model.lora_alpha, config.model.target_modules)
        self.engine = TrainEngine(module, fsdp, optim, total_training_steps=self.total_steps, role="sft")
        self.rng = random.Random(config.trainer.seed)

    def _batches(self):
        bsz = self.config.data.train_batch_size
        while True:
            order = list(range(len(self.examples)))
            if self.config.data.shuffle:
                self.rng.shuffle(order)
            for start in range(0, max(len(order) - bsz + 1, 1), bsz):
                yield [self.examples[i] for i in order[start:start + bsz]]

    def _local(self, examples: list[SFTExample]) -> list[SFTExample]:
        per_rank = len(examples) // self.world
        return examples[self.rank * per_rank:(self.rank + 1) * per_rank]

    def train_step(self, examples: list[SFTExample]) -> dict[str, float]:
        micro = self.config.data.micro_batch_size_per_gpu
        pad = self.tokenizer.pad_token_id
        num_tokens = sum(sum(e.loss_mask) for e in examples)  # the whole mini-batch, on every rank
        self.engine.module.train()
        loss_sum = 0.0
        local = self._local(examples)
        for start in range(0, len(local), micro):
            batch = collate_sft(local[start:start + micro], pad)
            batch = {k: v.to(self.engine.device) for k, v in batch.items()}
            loss, raw = sft_loss(self.engine.module, batch, num_tokens, self.config.use_remove_padding)
            (loss * self.world).backward()  # FSDP averages gradients over ranks; the sum is wanted
            loss_sum += raw
        (loss_sum,) = self.engine.all_reduce_sum([loss_sum])
        result = self.engine.optimizer_step(self.config.optim.clip_grad)
        lr = self.engine.lr_scheduler_step()
        return {"train/loss": loss_sum / max(num_tokens, 1), "train/grad_norm": result.grad_norm, "train/lr": lr}

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Token-mean loss over ``val_examples`` (each rank its share; every rank runs as many micro-batches)."""
        micro = self.config.data.micro_batch_size_per_gpu
        pad = self.tokenizer.pad_token_id
        share = self.val_examples[self.rank::self.world]
        rows = -(-len(self.val_examples) // self.world)
        filler = SFTExample(self.val_examples[0].input_ids, [0] * len(self.val_examples[0].input_ids))
        share = share + [filler] * (rows - len(share))  # no loss tokens: keeps the ranks' passes in step
        self.engine.module.eval()
        total = tokens = 0.0
        for start in range(0, len(share), micro):
            batch = {k: v.to(self.engine.device) for k, v in collate_sft(share[start:start + micro], pad).items()}
            total += sft_loss(self.engine.module, batch, 1, self.config.use_remove_padding)[1]
            tokens += float(batch["loss_mask"].sum())
        total, tokens = self.engine.all_reduce_sum([total, tokens])
        return total / max(tokens, 1.0)

    def fit(self) -> SFTResult:
        start = time.perf_counter()
        history = []
        batches = self._batches()
        test_freq = self.config.trainer.test_freq
        for step in range(1, self.total_steps + 1):
            metrics = self.train_step(next(batches))
            if self.val_examples and (step == self.total_steps or (test_freq > 0 and step % test_freq == 0)):
                metrics["val/loss"] = self.validation_loss()
            history.append({"step": step, **metrics})
            if self.on_step is not None and self.rank == 0:
                self.on_step(step, metrics)
        hf_dir = None
        if self.config.trainer.save_hf_model:
            from hybridflow.engine.engine_checkpoint import export_hf_model

            hf_dir = str(Path(self.config.trainer.default_local_dir) / "huggingface")
            export_hf_model(self.engine, hf_dir, tokenizer=self.tokenizer, with_weights=True)  # every rank
        return SFTResult(history=history, hf_dir=hf_dir, seconds=time.perf_counter() - start)


def run_sft(config: SFTConfig, rows: Sequence[dict] | None = None,
            on_step: Callable[[int, dict[str, float]], None] | None = None) -> SFTResult:
    """Train in this process (one rank, or this rank of a joined process group); ``rows`` (verl-format dicts)
    replace ``data.train_files`` when given."""
    from hybridflow.engine.model_loader import load_tokenizer

    torch.manual_seed(config.trainer.seed)
    np.random.seed(config.trainer.seed)
    tokenizer = load_tokenizer(config.model.partial_pretrain, config.model.trust_remote_code,
                               field="model.partial_pretrain")
    rows = list(rows) if rows is not None else read_sft_rows(config.data.train_files)
    examples = build_examples(rows, tokenizer, config.data)
    val = build_examples(read_sft_rows(config.data.val_files), tokenizer, config.data) if config.data.val_files else None
    return SFTTrainer(config, tokenizer, examples, on_step=on_step, val_examples=val).fit()


def _run_logged(config: SFTConfig) -> SFTResult | None:
    """One rank of the command: ``run_sft`` with rank 0 logging to ``trainer.logger`` (and returning the result;
    other ranks return None)."""
    from hybridflow.engine.fsdp import is_distributed
    from hybridflow.tracking import Tracking

    tracking = None
    if not is_distributed() or dist.get_rank() == 0:
        tracking = Tracking(config.trainer.project_name, config.trainer.experiment_name, config.trainer.logger,
                            config=config, total_steps=config.trainer.total_training_steps)
    try:
        result = run_sft(config, on_step=(lambda step, m: tracking.log(m, step)) if tracking is not None else None)
        return result if tracking is not None else None
    finally:
        if tracking is not None:
            tracking.finish()


def main(argv: Sequence[str] | None = None) -> SFTResult | None:
    from hybridflow.sft.launch import run_ranks, select_device
    from hybridflow.utils.quiet import quiet_libraries

    quiet_libraries()
    config = load_sft_config(list(sys.argv[1:] if argv is None else argv))
    select_device(config.trainer.device)
    result = run_ranks(_run_logged, config)
    if result is not None:
        print(f"SFT finished in {result.seconds:.1f}s; HF model: {result.hf_dir}", flush=True)
    return result


if __name__ == "__main__":
    main()
