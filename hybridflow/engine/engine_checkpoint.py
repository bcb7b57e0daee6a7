"""Sharded checkpoints of a ``TrainEngine`` and HF-format export.

Layout of one role's folder (``global_step_N/actor/`` or ``.../critic/``), as verl's FSDP checkpoints:

* ``model_world_size_{W}_rank_{R}.pt``        this rank's parameter shards (DTensors; plain tensors at W=1)
* ``optim_world_size_{W}_rank_{R}.pt``        this rank's optimizer state (Adam moments, step)
* ``extra_state_world_size_{W}_rank_{R}.pt``  LR scheduler state + RNG states (``utils/rng_state.py``)
* ``fsdp_config.json``                        ``{"FSDP_version": 2, "world_size": W, "layout": {"dp", "sp",
                                              "tp", "ep"}}``
* ``huggingface/``                            config, generation config and tokenizer; full weights
                                              (LoRA merged) when ``"hf_model"`` is in ``save_contents``

Restoring model, optimizer, schedule *and* RNG is what makes a resumed run continue exactly as if it
had never stopped.  A run on the layout that saved the checkpoint loads its own rank's files.  A run on another
layout (tensor parallel 2 -> 1, another world size) reads every rank's files, puts each parameter and Adam moment
back together (``engine/shard_merge.py``) and lets every rank take its new piece of them: the model and the
optimizer continue exactly, the RNG streams are those of the rank with the same index (rank 0's when the saving
run had fewer ranks).  That costs a full copy of the model and its optimizer state in every rank's memory once,
at load time.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

import torch
import torch.distributed as dist

from hybridflow.engine.shard_merge import load_pieces
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.engine.transformers_adapter import unwrap_peft
from hybridflow.utils.rng_state import capture_rng_state, restore_rng_state
from hybridflow.utils.safe_load import load_torch_file

__all__ = ["CheckpointMismatchError", "check_model_fits", "save_engine_checkpoint", "load_engine_checkpoint",
           "export_hf_model"]

_ALL_CONTENTS = ("model", "optimizer", "extra", "hf_model")


class CheckpointMismatchError(ValueError):
    """A checkpoint folder whose parameters do not fit the model being trained (another model's checkpoint)."""


def check_model_fits(engine: TrainEngine, state: dict, folder: str, field: str, strict: bool = True) -> dict:
    """Refuse ``state`` (read from ``folder``) unless its parameters have this model's names and global shapes.

    Without it, ``load_state_dict`` raises torch's size-mismatch traceback, which names neither the folder nor a
    fix (issue 34).  With ``strict=False`` (verl's ``checkpoint.strict``) names may differ: the model's tensors the
    checkpoint lacks keep their values, the checkpoint's tensors the model lacks are left out (said in a warning);
    shapes must still agree.  Returns the part of ``state`` to load."""
    own = {name: tuple(value.shape) for name, value in engine.module.state_dict().items()}
    fix = (f"resume from a checkpoint written by this model, or train the model that wrote it "
           f"({field.rsplit('.checkpoint', 1)[0]}'s model path); trainer.resume_mode=disable starts afresh")
    for name, value in state.items():
        shape = tuple(getattr(value, "shape", ()))
        if name in own and shape != own[name]:
            raise CheckpointMismatchError(
                f"checkpoint {folder} does not fit this model: parameter {name!r} has shape {shape} in the "
                f"checkpoint and {own[name]} in the model: {fix}")
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if (missing or unexpected) and strict:
        raise CheckpointMismatchError(
            f"checkpoint {folder} does not fit this model: {len(missing)} of the model's parameters are not in "
            f"it {missing[:3]} and {len(unexpected)} of its parameters are not in the model {unexpected[:3]}: {fix} "
            f"(or set {field.rsplit('.', 1)[0]}.strict=false to load the tensors both have)")
    if missing or unexpected:
        import warnings

        warnings.warn(f"{field.rsplit('.', 1)[0]}.strict=false: {len(missing)} of the model's tensors are not in "
                      f"{folder} and keep their values {missing[:3]}; {len(unexpected)} of its tensors are not in the "
                      f"model and are left out {unexpected[:3]}; the optimizer state starts afresh", stacklevel=3)
    return {k: v for k, v in state.items() if k in own}


def _names(path: str, world: int, rank: int) -> dict[str, str]:
    suffix = f"world_size_{world}_rank_{rank}.pt"
    return {k: os.path.join(path, f"{k}_{suffix}") for k in ("model", "optim", "extra_state")}


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
    rng = capture_rng_state()  # saving must not perturb the random streams (the HF export initialises a model)
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
    restore_rng_state(rng)
    if rank == 0:
        with open(os.path.join(path, "fsdp_config.json"), "w") as f:
            json.dump({"FSDP_version": 2 if engine.is_sharded else 0, "world_size": world,
                       "layout": _layout(engine)}, f)
    if dist.is_initialized():
        dist.barrier()


def _layout(engine: TrainEngine) -> dict[str, int]:
    pd = engine.parallel_dims
    layout = {"dp": pd.dp, "sp": pd.sp, "tp": pd.tp, "ep": pd.ep}
    if pd.pp > 1:  # which rank holds which layers
        layout.update(pp=pd.pp, vpp=pd.vpp)
    return layout


def saved_layout(path: str) -> tuple[int, dict[str, int]] | None:
    """(world size, layout) a checkpoint folder was saved with (layouts before tp/ep: dp x sp), or ``None``."""
    meta = os.path.join(path, "fsdp_config.json")
    if not os.path.isfile(meta):
        return None
    with open(meta) as f:
        info = json.load(f)
    world = int(info.get("world_size", 1))
    return world, info.get("layout") or {"dp": world, "sp": 1, "tp": 1, "ep": 1}


def _rank_files(path: str, kind: str) -> dict[int, str]:
    """``{rank: file}`` of one kind (``model`` / ``optim`` / ``extra_state``) of the world that saved ``path``."""
    import re

    pattern = re.compile(rf"^{kind}_world_size_(\d+)_rank_(\d+)\.pt$")
    found = {}
    for name in os.listdir(path) if os.path.isdir(path) else []:
        m = pattern.match(name)
        if m:
            found[int(m.group(2))] = (int(m.group(1)), os.path.join(path, name))
    worlds = {w for w, _ in found.values()}
    if len(worlds) > 1 or (found and sorted(found) != list(range(next(iter(worlds))))):
        raise FileNotFoundError(f"{path}: incomplete or mixed {kind} shards {sorted(os.path.basename(p) for _, p in found.values())}")
    return {r: p for r, (_, p) in found.items()}


def load_engine_checkpoint(
    engine: TrainEngine,
    path: str,
    load_contents: Iterable[str] = ("model", "optimizer", "extra"),
    field: str = "actor.checkpoint.load_contents",
    strict: bool = True,
) -> None:
    """Restore what ``save_engine_checkpoint`` wrote, on the same layout or another one (see the module docstring).
    ``strict=False``: the model loads the tensors it shares with the checkpoint (:func:`check_model_fits`)."""
    contents = _check_contents(load_contents, field)
    world, rank = engine.world_size, engine.rank
    files = _names(path, world, rank)
    saved = saved_layout(path)
    if saved is not None and saved != (world, _layout(engine)) and (engine.is_sharded or saved[0] > 1):
        _load_resharded(engine, path, contents, saved, field, strict)
        return
    if "model" in contents and not os.path.exists(files["model"]):
        found = sorted(f for f in os.listdir(path) if f.startswith("model_")) if os.path.isdir(path) else []
        raise FileNotFoundError(
            f"no shard {os.path.basename(files['model'])} in {path} (found {found or 'nothing'}; this run has "
            f"world size {world}) and no fsdp_config.json saying which layout wrote them, so they cannot be "
            "resharded: point the resume at a complete checkpoint folder"
        )
    with engine.on_device(with_optimizer=True):
        fits = True
        if "model" in contents:
            full = load_pieces(files["model"], map_location=engine.device)
            state = check_model_fits(engine, full, path, field, strict)
            fits = len(state) == len(full) == len(engine.module.state_dict())
            if engine.is_sharded:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

                set_model_state_dict(engine.module, state, options=StateDictOptions(strict=fits))
            else:
                engine.module.load_state_dict(state, strict=fits)
        if "optimizer" in contents and engine.optimizer is not None and fits:
            state = load_pieces(files["optim"], map_location=engine.device)
            if engine.is_sharded:
                from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

                set_optimizer_state_dict(engine.module, engine.optimizer, state)
            else:
                engine.optimizer.load_state_dict(state)
        if "extra" in contents:
            extra = load_torch_file(files["extra_state"])
            if engine.lr_scheduler is not None and extra["lr_scheduler"] is not None:
                engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
            restore_rng_state(extra["rng"])


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


def _load_resharded(engine: TrainEngine, path: str, contents: set[str], saved: tuple[int, dict[str, int]],
                    field: str, strict: bool = True) -> None:
    """Load a checkpoint saved on another layout: full tensors from every rank's pieces, each rank keeps its own."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from hybridflow.engine.shard_merge import merge_state_dicts

    options = StateDictOptions(full_state_dict=True)
    with engine.on_device(with_optimizer=True):
        fits = True
        if "model" in contents:
            merged = _own(engine, _merged(path, "model", merge_state_dicts))
            full = check_model_fits(engine, merged, path, field, strict)
            fits = len(full) == len(merged) == len(engine.module.state_dict())
            if engine.is_sharded:
                set_model_state_dict(engine.module, full, options=StateDictOptions(full_state_dict=True, strict=fits))
            else:
                engine.module.load_state_dict(full, strict=fits)
            del full, merged
        if "optimizer" in contents and engine.optimizer is not None and fits:
            full = _merged(path, "optim", merge_state_dicts)
            if saved[0] == 1:  # one process saved optimizer.state_dict(): state keyed by parameter index
                full = _fqn_keyed(engine, full)
            full = _own_optimizer_state(engine, full)
            if engine.is_sharded:
                set_optimizer_state_dict(engine.module, engine.optimizer, full, options=options)
            else:
                _load_full_optimizer_state(engine, full)
            del full
        if "extra" in contents:
            extra_files = _rank_files(path, "extra_state")
            own = extra_files.get(engine.rank, extra_files.get(0))
            if own is not None:
                extra = load_torch_file(own)
                if engine.lr_scheduler is not None and extra["lr_scheduler"] is not None:
                    engine.lr_scheduler.load_state_dict(extra["lr_scheduler"])
                restore_rng_state(extra["rng"])
    if dist.is_initialized():
        dist.barrier()


def _own(engine: TrainEngine, full: dict) -> dict:
    """With pipeline parallelism, the part of a full state dict this rank's stages hold (the others' are dropped)."""
    if engine.pipeline is None:
        return full
    own = set(engine.module.state_dict())
    return {k: v for k, v in full.items() if k in own}


def _own_optimizer_state(engine: TrainEngine, full: dict) -> dict:
    """A full FQN-keyed optimizer state cut to this rank's parameters.  A tied embedding is one parameter without
    a pipeline and two copies with one (the first stage's embedding, the last stage's head, stepping alike): a
    state saved with the copies drops the head's, one saved without gives the head the embedding's."""
    own = {n for n, _ in engine.module.named_parameters()}
    state = {k: v for k, v in full["state"].items() if k in own}
    head, emb = engine.tied_head_weight, None
    if head is not None and head in own and head not in state:
        emb = f"{engine.tied_embedding[0]}.weight"
        if emb in full["state"]:
            state[head] = full["state"][emb]
    groups = []
    for g in full["param_groups"]:
        names = [n for n in g["params"] if n in own]
        if emb is not None and emb in g["params"] and head not in names:
            names.append(head)
        groups.append({**g, "params": names})
    return {"state": state, "param_groups": groups}


def _merged(path: str, kind: str, merge) -> dict:
    files = _rank_files(path, kind)
    if not files:
        raise FileNotFoundError(f"{path} holds no {kind}_world_size_W_rank_R.pt files to resume from")
    states = {r: load_pieces(f) for r, f in sorted(files.items())}
    return merge(states)


def _fqn_keyed(engine: TrainEngine, state: dict) -> dict:
    """``optimizer.state_dict()`` of an unsharded run (parameters numbered in the order the optimizer was built
    from ``module.parameters()``) in the FQN-keyed form ``set_optimizer_state_dict`` takes."""
    names = [n for n, p in engine.module.named_parameters() if p.requires_grad]
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [names[i] for i in group["params"]]})
    return {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}


def _load_full_optimizer_state(engine: TrainEngine, full: dict) -> None:
    """A full, FQN-keyed optimizer state (``get_optimizer_state_dict`` format) into a plain, unsharded module's
    optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(engine.module, engine.optimizer, full, options=StateDictOptions(full_state_dict=True))
