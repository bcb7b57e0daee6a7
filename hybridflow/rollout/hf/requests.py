"""What a caller hands the continuous batcher: one request, and the engine's sizing limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.hf.vision import VisionRequest
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["BatcherLimits", "GenerationRequest"]


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    on_done: Callable[[TokenOutput], None]
    on_error: Callable[[BaseException], None]
    vision: VisionRequest | None = None  # pixel inputs + M-RoPE positions of an image prompt (hf/vision.py)


@dataclass(frozen=True)
class BatcherLimits:
    """The sizing knobs, named after verl's ``actor_rollout_ref.rollout`` keys."""

    max_num_seqs: int = 256  # rows of the cache: requests decoding at once (+ parked prefixes)
    max_model_len: int | None = None  # prompt + response tokens of one request
    max_num_batched_tokens: int = 8192  # tokens (padded) of one prefill forward; longer prompts are chunked
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.5  # CUDA: share of the free device memory the KV cache may take

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 (a prompt token and a response token), got "
                             f"{self.max_model_len}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
