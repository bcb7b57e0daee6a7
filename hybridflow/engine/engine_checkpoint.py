"""Sharded checkpoints of a ``TrainEngine`` and HF-format export.

Layout of one role's folder (``global_step_N/actor/`` or ``.../critic/``), as verl's FSDP checkpoints:

* ``model_world_size_{W}_rank_{R}.pt``        this rank's parameter shards (DTensors; plain tensors at W=1)
* ``optim_world_size_{W}_rank_{R}.pt``        this rank's optimizer state (Adam moments, step)
* ``extra_state_world_size_{W}_rank_{R}.pt``  LR scheduler state + RNG states (python, numpy, torch, cuda)
* ``fsdp_config.json``                        ``{"FSDP_version": 2, "world_size": W}``
* ``huggingface/``                            config, generation config and tokenizer; full weights
                                              (LoRA merged) when ``"hf_model"`` is in ``save_contents``

Restoring model, optimizer, schedule *and* RNG is what makes a resumed run continue exactly as if it
had never stopped.  Loading needs the same world size (the shards are per rank), as in verl.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any, Iterable

import numpy as np
import torch
import torch.distributed as dist

from hybridflow.engine.fsdp import unwrap_peft
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.utils.safe_load import load_torch_file

__all__ = ["save_engine_checkpoint", "load_engine_checkpoint", "export_hf_model", "rng_state", "set_rng_state"]

_ALL_CONTENTS = ("model", "optimizer", "extra", "hf_model")


def _names(path: str, world: int, rank: int) -> dict[str, str]:
    suffix = f"world_size_{world}_rank_{rank}.pt"
    return {k: os.path.join(path, f"{k}_{suffix}") for k in ("model", "optim", "extra_state")}


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _check_contents(contents: Iterable[str], field: str) -> set[str]:
    chosen = set(contents)
    unknown = chosen - set(_ALL_CONTENTS)
    if unknown:
        raise ValueError(f"{field} has unknown entries {sorted(unknown)}; allowed: {list(_ALL_CONTENTS)}")
    return chosen


def _model_state(engine: TrainEngine) -> dict[str, torch.Tensor]:
    if engine.is_sharded:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(engine.module)
    return engine.module.state_dict()


def _optim_state(engine: TrainEngine) -> dict[str, Any]:
    if engine.is_sharded:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(engine.module, engine.optimizer)
    return engine.optimizer.state_dict()


def save_engine_checkpoint(
    engine: TrainEngine,
    path: str,
    tokenizer=None,
    save_contents: Iterable[str] = ("model", "optimizer", "extra"),
    field: str = "actor.checkpoint.save_contents",
    processor=None,
) -> None:
    """Write this rank's shards (and, from rank 0, the ``huggingface/`` folder) under ``path``."""
    contents = _check_contents(save_contents, field)
    world, rank = engine.world_size, engine.rank
    os.makedirs(path, exist_ok=True)
    rng = rng_state()  # saving must not perturb the random streams (the HF export initialises a model)
    files = _names(path, world, rank)
    with engine.on_device(with_optimizer=True):
        if "model" in contents:
            torch.save(_model_state(engine), files["model"])
        if "optimizer" in contents and engine.optimizer is not None:
            torch.save(_optim_state(engine), files["optim"])
        if "extra" in contents:
            sched = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
            torch.save({"lr_scheduler": sched, "rng": rng}, files["extra_state"])
    export_hf_model(engine, os.path.join(path, "huggingface"), tokenizer, with_weights="hf_model" in contents,
                    processor=processor)
    set_rng_state(rng)
    if rank == 0:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2 if engine.is_sharded else 0, "world_size": world}, f)
    if dist.is_initialized():
        dist.barrier()


def load_engine_checkpoint(
    engine: TrainEngine,
    path: str,
    load_contents: Iterable[str] = ("model", "optimizer", "extra"),
    field: str = "actor.checkpoint.load_contents",
) -> None:
    """Restore what ``save_engine_checkpoint`` wrote; the world size must match."""
    contents = _check_contents(load_contents, field)
    world, rank = engine.world_size, engine.rank
    files = _names(path, world, rank)
    if "model" in contents and not os.path.exists(files["model"]):
        found = sorted(f for f in os.listdir(path) if f.startswith("model_")) if os.path.isdir(path) else []
        raise FileNotFoundError(
            f"no shard {os.path.basename(files['model'])} in {path} (found {found or 'nothing'}); checkpoints "
            f"load only with the world size they were saved with (this run has {world} ranks)"
        )
    with engine.on_device(with_optimizer=True):
        if "model" in contents:
            state = load_torch_file(files["model"], map_location=engine.device)
            if engine.is_sharded:
                from torch.distributed.checkpoint.state_dict import set_model_state_dict

                set_model_state_dict(engine.module, state)
            else:
                engine.module.load_state_dict(state)
        if "optimizer" in contents and engine.optimizer is not None:
            state = load_torch_file(files["optim"], map_location=engine.device)
            if engine.is_sharded:
                from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

                set_optimizer_state_dict(engine.module, engine.optimizer, state)
            else:
                engine.optimizer.load_state_dict(state)
        if "extra" in contents:
            extra = load_torch_file(files["extra_state"])
            if engine.lr_scheduler is not None and extra["lr_scheduler"] is not None:
                engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            set_rng_state(extra["rng"])


def export_hf_model(engine: TrainEngine, hf_dir: str, tokenizer=None, with_weights: bool = True,
                    processor=None) -> None:
    """Save an HF folder (config, tokenizer, and with ``with_weights`` the full merged weights).

    A vision-language model's ``processor`` (image processor, tokenizer, chat template) is saved with it.

    Weights are gathered to rank 0 (a collective: every rank must call this).  A LoRA model is
    exported with its adapters merged into the base weights, so the folder loads with plain
    ``from_pretrained``; the adapter alone is saved to ``hf_dir/lora_adapter``.
    """
    state = engine.full_state_dict() if with_weights else None
    if engine.rank != 0:
        return
    os.makedirs(hf_dir, exist_ok=True)
    base = unwrap_peft(engine.module)
    base.config.save_pretrained(hf_dir)
    generation_config = getattr(base, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(hf_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(hf_dir)
    if processor is not None:
        from hybridflow.utils.hf_processor import save_processor

        save_processor(processor, hf_dir)
    if with_weights:
        _save_full_weights(engine.module, state, hf_dir)


def _save_full_weights(module, state: dict[str, torch.Tensor], hf_dir: str) -> None:
    """Rebuild an unsharded CPU copy from ``state`` and ``save_pretrained`` it (merging LoRA)."""
    from transformers import AutoConfig

    base = unwrap_peft(module)
    config = AutoConfig.from_pretrained(hf_dir)
    with torch.device("cpu"):
        copy = type(base)._from_config(config, dtype=torch.float32)
    peft_config = getattr(module, "peft_config", None)
    if peft_config:
        from peft import get_peft_model

        adapter = peft_config["default"]
        copy = get_peft_model(copy, adapter)
        copy.load_state_dict(state)
        copy.save_pretrained(os.path.join(hf_dir, "lora_adapter"))
        copy = copy.merge_and_unload()
    else:
        copy.load_state_dict(state)
    copy.save_pretrained(hf_dir)
