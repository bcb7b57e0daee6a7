"""Moving the actor's weights into vLLM: bucketed materialisation, tied heads, safetensors and LoRA folders.

Shared by the in-process engine (tensors handed to vLLM's ``reload_weights`` directly) and the server fleet
(a safetensors folder under /dev/shm that each server reloads from).  No vLLM import here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import torch

__all__ = ["materialise_in_buckets", "with_tied_head", "model_config", "shm_folder", "write_safetensors_folder",
           "write_lora_adapter", "peft_adapter_key"]

NamedTensors = Iterable[tuple[str, torch.Tensor]]


def model_config(model_path: str) -> dict:
    """``config.json`` of an HF folder (``{}`` when absent)."""
    f = Path(os.path.expanduser(model_path)) / "config.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def with_tied_head(named_tensors: NamedTensors) -> Iterator[tuple[str, torch.Tensor]]:
    """Add ``lm_head.weight`` = the embedding when the stream has none (tied embeddings).

    ``named_parameters()`` and ``save_pretrained`` list a tied tensor once, as the embedding; vLLM's in-place
    reload puts back every parameter it does not receive, so without this the old head would stay.
    """
    seen_head, embedding = False, None
    for name, tensor in named_tensors:
        seen_head = seen_head or name.endswith("lm_head.weight")
        if name.endswith("embed_tokens.weight"):
            embedding = (name, tensor)
        yield name, tensor
    if embedding is not None and not seen_head:
        prefix = embedding[0][: -len("model.embed_tokens.weight")]
        yield prefix + "lm_head.weight", embedding[1]


def materialise_in_buckets(named_tensors: NamedTensors, bucket_bytes: int,
                           device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield full tensors on ``device``, materialising at most ``bucket_bytes`` ahead of the consumer.

    Materialising means gathering an FSDP2 ``DTensor`` (``full_tensor()``, one parameter at a time) and copying
    to the engine's device: the transient memory of a weight sync is one bucket, not the whole model
    (verl's ``update_weights_bucket_megabytes``).
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.detach().to(device, non_blocking=True)
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        if size >= bucket_bytes:
            if device.type == "cuda":
                torch.cuda.current_stream().synchronize()
            yield from bucket
            bucket, size = [], 0
    if device.type == "cuda" and bucket:
        torch.cuda.current_stream().synchronize()
    yield from bucket


def shm_folder(prefix: str) -> str:
    """A fresh private folder in /dev/shm (RAM-backed) when there is one, else in the temp dir."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in prefix)
    return tempfile.mkdtemp(prefix=f"hybridflow-{safe}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)


def write_safetensors_folder(named_tensors: NamedTensors, folder: str | os.PathLike,
                             checksums: dict[str, str] | None = None) -> int:
    """Write the tensors as ``model.safetensors`` in ``folder`` (replacing it); returns how many.
    ``checksums``: filled with each written tensor's digest (hex), for the reader to verify."""
    from safetensors.torch import save_file

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tensors = {}
    for name, tensor in named_tensors:
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensors[name] = tensor.detach().to("cpu").contiguous()
    # Tied tensors share storage; safetensors refuses shared storage, so give each its own.
    seen: set[int] = set()
    for name, tensor in tensors.items():
        if tensor.data_ptr() in seen:
            tensors[name] = tensor.clone()
        seen.add(tensors[name].data_ptr())
    save_file(tensors, str(folder / "model.safetensors"))
    if checksums is not None:
        from hybridflow.rollout.weights.delta import hex_digests

        checksums.update(hex_digests(tensors.items()))
    return len(tensors)


def peft_adapter_key(name: str) -> str:
    """``...q_proj.lora_A.default.weight`` (a PEFT model's parameter) -> ``base_model.model....q_proj.lora_A.weight``
    (the name in a saved PEFT adapter, which vLLM's LoRA loader reads)."""
    for part in (".lora_A.", ".lora_B."):
        if part in name:
            head, tail = name.split(part, 1)
            if not tail.startswith("weight"):  # drop the adapter name ("default")
                tail = tail.split(".", 1)[1]
            name = head + part + tail
    if not name.startswith("base_model.model."):
        name = "base_model.model." + name
    return name


def write_lora_adapter(named_tensors: NamedTensors, folder: str | os.PathLike, rank: int, alpha: float,
                       base_model: str, checksums: dict[str, str] | None = None) -> int:
    """Write the LoRA tensors among ``named_tensors`` as a PEFT adapter folder; returns how many tensors.

    Everything else (the frozen base) is skipped: LoRA training only ever changes the adapter.
    """
    from safetensors.torch import save_file

    adapter: dict[str, torch.Tensor] = {}
    modules: set[str] = set()
    for name, tensor in named_tensors:
        if ".lora_A." not in name and ".lora_B." not in name:
            continue
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        key = peft_adapter_key(name)
        adapter[key] = tensor.detach().to("cpu").contiguous()
        modules.add(key.split(".lora_")[0].rsplit(".", 1)[-1])
    if not adapter:
        raise ValueError("update_weights: lora_rank > 0 but no '.lora_A.'/'.lora_B.' tensors were passed "
                         "(pass the PEFT model's named parameters)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(adapter, str(folder / "adapter_model.safetensors"))
    if checksums is not None:
        from hybridflow.rollout.weights.delta import hex_digests

        checksums.update(hex_digests(adapter.items()))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": int(rank), "lora_alpha": float(alpha), "target_modules": sorted(modules),
        "bias": "none", "base_model_name_or_path": base_model, "task_type": "CAUSAL_LM", "lora_dropout": 0.0,
        "fan_in_fan_out": False,
    }))
    return len(adapter)
