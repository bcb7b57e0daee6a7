"""Split a module over the model-parallel dimensions of its layout, before FSDP2 shards it over the data ones.

``TrainEngine`` calls :func:`split_model` when the role's ``ParallelDims`` has tensor or expert parallelism:
experts first (their weights become ``DTensor`` s sharded over ``ep``), then the tensor-parallel plan over ``tp``
(attention, MLP, embedding, LM head).  The returned experts modules get FSDP units of their own over the expert
data-parallel mesh; everything else is sharded per decoder layer as without model parallelism.
"""

from __future__ import annotations

from torch import nn

from hybridflow.engine.expert_parallel import apply_expert_parallel
from hybridflow.engine.parallel_dims import ParallelDims
from hybridflow.engine.tensor_parallel import apply_tensor_parallel

__all__ = ["split_model"]


def split_model(module: nn.Module, dims: ParallelDims) -> list[nn.Module]:
    """Apply expert and tensor parallelism to ``module`` in place; returns its expert-parallel experts modules."""
    experts = (apply_expert_parallel(module, dims.ep_mesh, dims.ep_key, dims.expert_token_split)
               if dims.ep > 1 else [])
    if dims.tp > 1:
        apply_tensor_parallel(module, dims.tp_mesh, dims.tp_key)
    return experts
