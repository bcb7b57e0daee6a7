"""A LoRA actor's weights as the rollout sees them, piece by piece: the switch to a split rollout
(``engine/shard_switch.py``) reads each training rank's box of every tensor; for a peft model the tensors go by
their plain names (peft's ``base_model.model.`` and ``.base_layer`` left out) and a weight an adapter wraps is read
merged: the rank's box of ``W + scaling x B A``, with ``B`` and ``A`` gathered (small: rank r) and multiplied only
for the box's rows and columns, so no rank builds the whole merged matrix. Equal to peft's ``merge_and_unload`` on
the box (``tests/engine/test_lora_pieces.py``).

Gathering ``A`` and ``B`` is a collective, so every rank reads the same tensors in the same order (the switch and
its checksums do); a pipeline stage holds other layers than its peers, which is why LoRA with a split rollout is
refused with pipeline stages. Adapters on MoE expert parameters (peft's ``ParamWrapper``) are refused too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterator

import torch
from torch import nn

from hybridflow.engine.reshard import _full, _named_sources
from hybridflow.engine.shard_switch import _local, _state_tensors

__all__ = ["MergedTrainingState", "training_state"]


class MergedTrainingState(Mapping):
    """``{plain name: tensor}`` of a peft model; a wrapped weight is merged when read (see the module docstring).
    :meth:`stored` gives the tensor as stored (its box, no collective)."""

    def __init__(self, module: nn.Module):
        self._sources = {}
        for name, tensor, layers in _named_sources(module, "merged"):
            for layer in layers:
                if getattr(layer, "parameter_name", None) is not None:
                    raise ValueError(f"LoRA on the expert parameter {name!r} with a split rollout: the switch merges "
                                     "linear layers' adapters piece by piece only; set "
                                     "actor_rollout_ref.rollout.tensor_model_parallel_size=1")
            self._sources[name] = (tensor, layers)

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor, layers = self._sources[name]
        if not layers:
            return tensor
        return _merged_piece(tensor, layers)

    def stored(self, name: str) -> torch.Tensor:
        return self._sources[name][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)


def _merged_piece(tensor: torch.Tensor, layers: list[nn.Module]) -> torch.Tensor:
    """This rank's box of the merged weight, shaped and placed as ``tensor`` (a DTensor stays one)."""
    from hybridflow.engine.shard_switch import local_box

    local = _local(tensor)
    (r0, r1), (c0, c1) = local_box(tensor)
    out = local.float()
    for layer in layers:
        for adapter in layer.lora_A:
            if adapter not in layer.active_adapters:
                continue
            a = _full(layer.lora_A[adapter].weight).float()  # r x in
            b = _full(layer.lora_B[adapter].weight).float()  # out x r
            if getattr(layer, "fan_in_fan_out", False):  # the weight is stored in x out
                delta = (b[c0:c1] @ a[:, r0:r1]).T
            else:
                delta = b[r0:r1] @ a[:, c0:c1]
            out = out + delta.to(out.device) * layer.scaling[adapter]
    out = out.to(local.dtype)
    if hasattr(tensor, "device_mesh"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(out, tensor.device_mesh, tensor.placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())
    return out


def training_state(module: nn.Module) -> Mapping[str, torch.Tensor]:
    """What the switch reads from a training module: a peft model's :class:`MergedTrainingState`, a plain module's
    parameters and persistent buffers (tied tensors once)."""
    if hasattr(module, "peft_config"):
        return MergedTrainingState(module)
    return _state_tensors(module)
