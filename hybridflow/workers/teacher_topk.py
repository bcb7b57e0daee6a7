"""A teacher's top-k pass (verl's ``forward_kl_topk`` distillation): its ``k`` most likely tokens at every response
position of the student's samples, ids and log-probs, micro-batch by micro-batch in the batch's row order."""

from __future__ import annotations

import torch

from hybridflow.algorithms.distillation import TEACHER_TOPK
from hybridflow.engine.topk_outputs import response_topk
from hybridflow.engine.train_engine import TrainEngine
from hybridflow.protocol import DataProto
from hybridflow.workers.micro_batching import MicroBatchSpec, gather_in_order, split_micro_batches

__all__ = ["compute_topk_outputs", "wants_topk"]

_KEYS = ("responses", "input_ids", "attention_mask", "position_ids")


def wants_topk(data: DataProto) -> int:
    """The ``k`` the trainer asks a teacher for (0: the sampled tokens' log-probs only)."""
    return int(data.meta_info.get(TEACHER_TOPK) or 0)


def compute_topk_outputs(engine: TrainEngine, data: DataProto, spec: MicroBatchSpec, temperature: float, k: int,
                         use_remove_padding: bool) -> dict[str, torch.Tensor]:
    """``log_probs`` (B, R), ``topk_log_probs`` and ``topk_ids`` (B, R, k) of ``engine``'s module, no gradient."""
    if engine.pipeline is not None:
        raise ValueError("distillation loss_mode=forward_kl_topk: a teacher split into pipeline stages cannot report "
                         "its top-k tokens here; give the teacher pipeline_model_parallel_size=1")
    batch = data.select(batch_keys=list(_KEYS))
    micro_batches, parts = split_micro_batches(batch, spec, sp=engine.parallel_dims.sp)
    pieces: dict[str, list[torch.Tensor]] = {}
    module = engine.module
    was_training = module.training
    module.eval()
    with torch.no_grad(), engine.on_device(), engine.autocast():
        for mb in micro_batches:
            outs = response_topk(module, mb.batch.to(engine.device), k, temperature, use_remove_padding,
                                 sequence_parallel=engine.sequence_parallel)
            for key, value in outs.items():
                pieces.setdefault(key, []).append(value.cpu() if key == "topk_ids" else value.float().cpu())
    module.train(was_training)
    return {key: gather_in_order(values, parts) for key, values in pieces.items()}
