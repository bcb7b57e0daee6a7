"""``hybridflow merge``: turn an actor (or critic) checkpoint into a Hugging Face folder.

An actor folder holds one ``model_world_size_W_rank_R.pt`` per rank (FSDP2 ``Shard(0)`` DTensors when
``W > 1``) plus ``huggingface/`` (config, tokenizer).  Merging concatenates each parameter's rank-local
pieces along its shard dimension (in rank order; FSDP2 pieces are contiguous chunks), and, for a LoRA
actor, folds the adapters into the base weights: ``W' = W + (alpha / r) * B @ A`` (Hu et al. 2021, LoRA,
eq. 3), so ``from_pretrained`` on the result needs no peft.  ``alpha`` comes from the step's manifest,
which the trainer writes with the LoRA settings it trained with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from hybridflow.trainer.run_checkpoint import MANIFEST_FILE, CheckpointError
from hybridflow.utils.safe_load import load_torch_file

_SHARD_RE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
_PEFT_PREFIX = "base_model.model."


def _role_dir(ckpt_dir: Path) -> Path:
    """Accept ``global_step_N`` (its ``actor``) or the role folder itself."""
    if (ckpt_dir / "actor").is_dir():
        return ckpt_dir / "actor"
    if any(_SHARD_RE.match(p.name) for p in ckpt_dir.iterdir()):
        return ckpt_dir
    raise CheckpointError(
        f"{ckpt_dir} holds no model shards (model_world_size_W_rank_R.pt); pass a global_step_N folder or its "
        "actor/ (or critic/) sub-folder"
    )


def _full_tensor(pieces: list[Any]) -> torch.Tensor:
    first = pieces[0]
    if not hasattr(first, "placements"):
        return first.detach().cpu()
    placement = first.placements[0]
    local = [p._local_tensor.detach().cpu() for p in pieces]
    if placement.is_shard():
        dim = placement.dim
        return torch.cat(local, dim=dim).narrow(dim, 0, first.shape[dim]).contiguous()
    return local[0]


def load_full_state_dict(role_dir: Path) -> dict[str, torch.Tensor]:
    """Unsharded CPU state dict of a role folder (any world size)."""
    shards = {int(m.group(2)): (int(m.group(1)), p) for p in role_dir.iterdir() if (m := _SHARD_RE.match(p.name))}
    worlds = {w for w, _ in shards.values()}
    if len(worlds) != 1 or sorted(shards) != list(range(next(iter(worlds)))):
        raise CheckpointError(f"{role_dir}: incomplete or mixed shards {sorted(p.name for _, p in shards.values())}")
    states = [load_torch_file(shards[r][1], map_location="cpu") for r in sorted(shards)]
    return {key: _full_tensor([s[key] for s in states]) for key in states[0]}


def fold_lora(state: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """Plain HF keys with every ``lora_A``/``lora_B`` pair folded into its base weight."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        name = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
        out[name.replace(".base_layer.", ".")] = value
    for key, a in state.items():
        if ".lora_A." not in key:
            continue
        b = state[key.replace(".lora_A.", ".lora_B.")]
        module = key.split(".lora_A.")[0]
        module = module[len(_PEFT_PREFIX):] if module.startswith(_PEFT_PREFIX) else module
        rank = a.shape[0]
        target = f"{module}.weight"
        out[target] = out[target] + (alpha / rank) * (b.float() @ a.float()).to(out[target].dtype)
    return out


def _lora_alpha(role_dir: Path) -> float:
    manifest_path = role_dir.parent / MANIFEST_FILE
    if manifest_path.is_file():
        lora = json.loads(manifest_path.read_text()).get("lora") or {}
        if "lora_alpha" in lora:
            return float(lora["lora_alpha"])
    adapter = role_dir / "huggingface" / "lora_adapter" / "adapter_config.json"
    if adapter.is_file():
        return float(json.loads(adapter.read_text())["lora_alpha"])
    raise CheckpointError(
        f"{role_dir} holds LoRA adapters but neither {manifest_path} nor {adapter} says their lora_alpha; "
        "the scale alpha/r is needed to merge them"
    )


def merge_checkpoint(ckpt_dir: str, target_dir: str) -> str:
    """Write ``target_dir`` as an HF model folder (config, tokenizer, merged weights); returns its path."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    from hybridflow.utils.hf_processor import load_processor, save_processor

    role_dir = _role_dir(Path(ckpt_dir))
    hf_dir = role_dir / "huggingface"
    if not (hf_dir / "config.json").is_file():
        raise CheckpointError(f"{hf_dir} has no config.json; the checkpoint was saved without its HF config")
    state = load_full_state_dict(role_dir)
    if any(".lora_A." in k for k in state):
        state = fold_lora(state, _lora_alpha(role_dir))
    config = AutoConfig.from_pretrained(hf_dir)
    auto_cls = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    with torch.device("cpu"):
        model = auto_cls.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise CheckpointError(
            f"{role_dir} does not match its config: missing {missing[:5]}, unexpected {unexpected[:5]} "
            "(a critic or reward-model folder cannot be exported as a causal LM)"
        )
    target = Path(target_dir)
    model.save_pretrained(target)
    if (hf_dir / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(hf_dir).save_pretrained(target)
    processor = load_processor(str(hf_dir))
    if processor is not None:  # a vision-language model: image processor + chat template travel with it
        save_processor(processor, str(target))
    return str(target)


__all__ = ["fold_lora", "load_full_state_dict", "merge_checkpoint"]
