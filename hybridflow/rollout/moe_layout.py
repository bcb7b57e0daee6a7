"""How a rollout engine lays out a MoE model's experts, read from verl's rollout keys (every engine's checks and the
vLLM adapter use it; no engine import).

verl has two spellings: ``expert_parallel_size`` = ``tensor_model_parallel_size x data_parallel_size`` is vLLM's
expert parallelism (the experts split over every rank of the engine), and TensorRT-LLM's
``moe_tensor_parallel_size x expert_parallel_size = tensor_model_parallel_size`` splits the MoE layers inside the
tensor-parallel group.  Only the first has an engine here; the second is accepted as verl's scripts write it and noted.
"""

from __future__ import annotations

__all__ = ["expert_parallel_over_tp_dp", "moe_split_note"]


def expert_parallel_over_tp_dp(rollout) -> bool:
    """``expert_parallel_size = tensor_model_parallel_size x data_parallel_size`` (> 1): vLLM's expert parallelism,
    the experts split over every rank of the engine (verl's rule for vLLM)."""
    ep = int(rollout.expert_parallel_size or 1)
    return ep > 1 and ep == int(rollout.tensor_model_parallel_size) * int(rollout.data_parallel_size)


def moe_split_note(rollout, engine: str) -> str | None:
    """Why ``rollout.expert_parallel_size`` has no effect on ``engine`` (None when it acts or is 1)."""
    ep = int(rollout.expert_parallel_size or 1)
    if ep <= 1 or (engine == "vllm" and expert_parallel_over_tp_dp(rollout)):
        return None
    tp, dp = int(rollout.tensor_model_parallel_size), int(rollout.data_parallel_size)
    layout = (f"vLLM's expert parallelism spans every rank of the engine (expert_parallel_size = "
              f"tensor_model_parallel_size x data_parallel_size = {tp * dp}); with another value it splits the experts "
              f"over its {tp} tensor-parallel rank(s)" if engine == "vllm" else
              "the hf engine keeps every expert of a layer together")
    return (f"actor_rollout_ref.rollout.expert_parallel_size={ep} has no effect with rollout.name={engine}: {layout} "
            "(the same numbers; TensorRT-LLM's moe_tensor_parallel_size x expert_parallel_size split is not an engine "
            "here)")
