"""Supervised fine-tuning with the same model engine as RL (``TrainEngine``): single- and multi-turn.

``python -m hybridflow.trainer.sft_trainer data.train_files=... model.partial_pretrain=... key=value ...``
(verl's ``sft_trainer.yaml`` key names) or ``run_sft(config, rows=...)`` from Python -- the quickstart uses
the latter to warm a random-init model up before GRPO.

Loss: token-mean cross-entropy over assistant tokens of the whole batch, normalised by the batch's total
number of loss tokens so gradient accumulation over micro-batches gives the same gradient as one big batch.
This in-process trainer uses world size 1 (``TrainEngine`` without a process group); the engine shards with
FSDP2 when started under torch.distributed.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from hybridflow.trainer.sft_data import (
    SFTExample,
    collate_sft,
    multi_turn_example,
    single_turn_example,
    truncate_example,
)


# ---------------------------------------------------------------------------------------------- config
@dataclass
class SFTMultiturnConfig:
    enable: bool = False
    messages_key: str = "messages"
    tools_key: str = "tools"  # per-row tool schemas rendered by the chat template (a missing column: no tools)


@dataclass
class SFTDataConfig:
    train_files: Any = None
    val_files: Any = None
    prompt_key: str = "prompt"
    response_key: str = "response"
    multiturn: SFTMultiturnConfig = field(default_factory=SFTMultiturnConfig)
    max_length: int = 1024
    truncation: str = "error"
    train_batch_size: int = 256
    micro_batch_size_per_gpu: int = 4
    shuffle: bool = True


@dataclass
class SFTModelConfig:
    partial_pretrain: str = ""
    trust_remote_code: bool = False
    dtype: str = "fp32"


@dataclass
class SFTOptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    clip_grad: float = 1.0
    lr_warmup_steps_ratio: float = 0.0
    lr_scheduler: str = "cosine"
    min_lr_ratio: float = 0.0


@dataclass
class SFTTrainerConfig:
    default_local_dir: str = "checkpoints/sft"
    project_name: str = "hybridflow_sft"
    experiment_name: str = "sft"
    total_epochs: int = 1
    total_training_steps: int | None = None
    logger: list = field(default_factory=lambda: ["console"])
    seed: int = 1
    save_hf_model: bool = True


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)


def load_sft_config(overrides: Sequence[str]) -> SFTConfig:
    """Defaults + ``key=value`` overrides (typed by the dataclasses; an unknown key is an error)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    base = OmegaConf.structured(SFTConfig)
    cleaned = [o.lstrip("+") for o in overrides]
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(cleaned))
    except (ConfigKeyError, ValidationError) as e:
        raise ValueError(f"bad SFT override: {e}".split("\n")[0] + " (keys follow verl's sft_trainer.yaml)") from e
    return OmegaConf.to_object(merged)


# ---------------------------------------------------------------------------------------------- data
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
            ex = single_turn_example(tokenizer, row[data.prompt_key], row[data.response_key], where)
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


def sft_loss(module, batch: dict[str, torch.Tensor], num_loss_tokens: int) -> tuple[torch.Tensor, float]:
    """Sum of next-token cross-entropy over loss tokens / ``num_loss_tokens`` of the whole batch."""
    logits = module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    position_ids=batch["position_ids"], use_cache=False).logits
    labels = torch.roll(batch["input_ids"], shifts=-1, dims=1)
    token_loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    mask = batch["loss_mask"].to(token_loss.dtype)
    total = (token_loss * mask).sum()
    return total / max(num_loss_tokens, 1), float(total.item())


@dataclass
class SFTResult:
    history: list[dict[str, float]]
    hf_dir: str | None
    seconds: float


class SFTTrainer:
    """Mini-batches of ``data.train_batch_size`` examples, micro-batches of ``micro_batch_size_per_gpu``."""

    def __init__(self, config: SFTConfig, tokenizer, examples: list[SFTExample],
                 on_step: Callable[[int, dict[str, float]], None] | None = None):
        from hybridflow.engine.model_loader import load_causal_lm
        from hybridflow.engine.train_engine import TrainEngine

        self.config = config
        self.tokenizer = tokenizer
        self.examples = examples
        self.on_step = on_step
        bsz = config.data.train_batch_size
        if bsz <= 0 or config.data.micro_batch_size_per_gpu <= 0:
            raise ValueError("data.train_batch_size and data.micro_batch_size_per_gpu must be positive")
        self.steps_per_epoch = max(len(examples) // bsz, 1)
        total = config.trainer.total_training_steps or self.steps_per_epoch * config.trainer.total_epochs
        self.total_steps = int(total)
        fsdp, optim = _engine_configs(config, self.total_steps)
        module = load_causal_lm(config.model.partial_pretrain, dtype=config.model.dtype,
                                trust_remote_code=config.model.trust_remote_code, field="model.partial_pretrain")
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

    def train_step(self, examples: list[SFTExample]) -> dict[str, float]:
        micro = self.config.data.micro_batch_size_per_gpu
        pad = self.tokenizer.pad_token_id
        num_tokens = sum(sum(e.loss_mask) for e in examples)
        self.engine.module.train()
        loss_sum = 0.0
        for start in range(0, len(examples), micro):
            batch = collate_sft(examples[start:start + micro], pad)
            batch = {k: v.to(self.engine.device) for k, v in batch.items()}
            loss, raw = sft_loss(self.engine.module, batch, num_tokens)
            loss.backward()
            loss_sum += raw
        result = self.engine.optimizer_step(self.config.optim.clip_grad)
        lr = self.engine.lr_scheduler_step()
        return {"train/loss": loss_sum / max(num_tokens, 1), "train/grad_norm": result.grad_norm, "train/lr": lr}

    def fit(self) -> SFTResult:
        start = time.perf_counter()
        history = []
        batches = self._batches()
        for step in range(1, self.total_steps + 1):
            metrics = self.train_step(next(batches))
            history.append({"step": step, **metrics})
            if self.on_step is not None:
                self.on_step(step, metrics)
        hf_dir = None
        if self.config.trainer.save_hf_model:
            from hybridflow.engine.engine_checkpoint import export_hf_model

            hf_dir = str(Path(self.config.trainer.default_local_dir) / "huggingface")
            export_hf_model(self.engine, hf_dir, tokenizer=self.tokenizer, with_weights=True)
        return SFTResult(history=history, hf_dir=hf_dir, seconds=time.perf_counter() - start)


def run_sft(config: SFTConfig, rows: Sequence[dict] | None = None,
            on_step: Callable[[int, dict[str, float]], None] | None = None) -> SFTResult:
    """Train; ``rows`` (verl-format dicts) replace ``data.train_files`` when given."""
    from hybridflow.engine.model_loader import load_tokenizer

    torch.manual_seed(config.trainer.seed)
    np.random.seed(config.trainer.seed)
    tokenizer = load_tokenizer(config.model.partial_pretrain, config.model.trust_remote_code,
                               field="model.partial_pretrain")
    rows = list(rows) if rows is not None else read_sft_rows(config.data.train_files)
    examples = build_examples(rows, tokenizer, config.data)
    return SFTTrainer(config, tokenizer, examples, on_step=on_step).fit()


def _print_step(step: int, metrics: dict[str, float]) -> None:
    print(f"step:{step} - " + " - ".join(f"{k}:{v:.4g}" for k, v in metrics.items()), flush=True)


def main(argv: Sequence[str] | None = None) -> SFTResult:
    from hybridflow.utils.quiet import quiet_libraries

    quiet_libraries()
    config = load_sft_config(list(sys.argv[1:] if argv is None else argv))
    result = run_sft(config, on_step=_print_step)
    print(f"SFT finished in {result.seconds:.1f}s; HF model: {result.hf_dir}")
    return result


if __name__ == "__main__":
    main()
