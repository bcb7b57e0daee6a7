"""Activation checkpointing decided by memory: an estimate of what a training micro-batch's decoder layers save for
backward, the memory a training process can spend on it, and the decision (``model.enable_gradient_checkpointing``
null = decide; true / false = as set).

Recomputing every decoder layer in backward costs a second forward (a third more FLOPs for a training step) and buys
memory; on a CPU host with gigabytes free, or a GPU whose activations fit, it is time lost for nothing. The estimate
counts, per token of one decoder layer, the tensors autograd keeps for a Llama-shaped layer under sdpa attention
(both RMSNorms' inputs and outputs, q and k before and after the rotary embedding, v, the attention output, the
MLP's gate, up, activation and product): ``7 h + 3 kv + 4 i`` values, ``h`` the hidden size, ``kv`` the key/value
width, ``i`` the MLP width (per routed expert times the experts each token visits, plus a shared expert's); eager
attention adds the scores and probabilities (``2 x heads x sequence`` per token). ``tests/engine/
test_activation_memory.py`` holds it against the bytes autograd really saves for tiny dense and MoE models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

# activations may take this share of what a training process has left once its parameters, gradients and AdamW
# states are counted: the rest is the head's logits, the rollout engine sharing the process, allocator slack
SHARE_OF_FREE = 0.5


def _field(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def per_token_layer_values(hf_config: Any, sequence: int, eager: bool = False, norms: int = 2,
                           qk_norms: bool = False) -> float:
    """Values one decoder layer keeps for backward per token (see the module's docstring); ``norms`` hidden-sized
    RMSNorms per layer (Gemma-2 has four), ``qk_norms`` per-head norms on queries and keys (Qwen3)."""
    text = getattr(hf_config, "text_config", None) or hf_config
    hidden = int(text.hidden_size)
    heads = int(_field(text, "num_attention_heads", default=1))
    head_dim = int(_field(text, "head_dim", default=hidden // heads))
    kv_heads = _field(text, "num_key_value_heads", default=heads)
    q = heads * head_dim
    mla_v = _field(text, "v_head_dim")
    if _field(text, "kv_lora_rank") is not None:  # MLA: keys and values expanded to every head
        q = heads * (int(_field(text, "qk_nope_head_dim", default=0)) + int(_field(text, "qk_rope_head_dim",
                                                                                    default=0)))
        kv = q + heads * int(mla_v or head_dim)
        q += int(_field(text, "q_lora_rank", default=0) or 0) + int(text.kv_lora_rank)
    else:
        kv = 2 * int(kv_heads) * head_dim
    values = 2 * norms * hidden + 4 * q + kv + heads + (2 * q + kv if qk_norms else 0)
    experts = _field(text, "num_experts", "n_routed_experts", "num_local_experts")
    dense = int(text.intermediate_size)
    if experts:
        # every routed token: its hidden state gathered, the expert's MLP, its output and its weighted output
        routed = int(_field(text, "num_experts_per_tok", "moe_topk", default=1))
        expert = int(_field(text, "moe_intermediate_size", "intermediate_size"))
        shared = _field(text, "shared_expert_intermediate_size")
        if shared is None and _field(text, "n_shared_experts"):
            shared = int(text.n_shared_experts) * expert
        values += routed * (3 * hidden + 4 * expert) + 4 * int(shared or 0) + 2 * int(experts)
    else:
        values += 4 * dense
    if eager:
        values += 2 * heads * sequence
    return float(values)


def layer_norms(module: Any) -> tuple[int, bool]:
    """(hidden-sized norms per decoder layer, whether queries and keys have their own norms) of a loaded model,
    read from its last decoder layer's modules."""
    layers = [m for name, m in module.named_modules() if name.endswith("layers") and len(m) > 0]
    if not layers:
        return 2, False
    names = [n for n, m in layers[0][-1].named_modules() if "norm" in type(m).__name__.lower()]
    qk = [n for n in names if n.rsplit(".", 1)[-1] in ("q_norm", "k_norm")]
    low_rank = [n for n in names if n.rsplit(".", 1)[-1] in ("q_a_layernorm", "kv_a_layernorm")]
    return max(1, len(names) - len(qk) - len(low_rank)), bool(qk)


def decoder_activation_bytes(hf_config: Any, tokens: int, sequence: int, dtype_bytes: int, *, sp: int = 1,
                             tp: int = 1, eager: bool = False, norms: int = 2, qk_norms: bool = False) -> int:
    """Bytes the decoder layers of one training micro-batch of ``tokens`` tokens (sequences up to ``sequence``)
    keep for backward on one rank: tokens split by Ulysses ``sp``, heads and MLP columns by ``tp``. Under
    pipeline stages a stage holds its layers for up to ``pp`` micro-batches in flight (1F1B), the same total."""
    text = getattr(hf_config, "text_config", None) or hf_config
    layers = int(_field(text, "num_hidden_layers", "n_layer", default=1))
    per_token = per_token_layer_values(hf_config, sequence, eager=eager, norms=norms, qk_norms=qk_norms)
    hidden = int(text.hidden_size)
    split = 2 * norms * hidden + (per_token - 2 * norms * hidden) / max(1, tp)  # norms stay whole; heads and MLP split by tp
    return int(layers * split * tokens / max(1, sp) * dtype_bytes)


def training_state_bytes(n_params: int, shards: int) -> int:
    """fp32 parameters, gradients and AdamW's two moments, sharded over ``shards`` ranks."""
    return int(16 * n_params / max(1, shards))


def free_bytes_per_process(device: str) -> int:
    """Memory a training process can count on: on CUDA the device's free memory now; on CPU the host's available
    memory divided among the node's training processes (``LOCAL_WORLD_SIZE``)."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    import psutil

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return int(psutil.virtual_memory().available // max(1, local))


@dataclass(frozen=True)
class CheckpointingDecision:
    enabled: bool
    reason: str

    def line(self, role: str) -> str:
        return f"activation checkpointing ({role}): {'on' if self.enabled else 'off'} -- {self.reason}"


def decide(setting: bool | None, field: str, *, activation_bytes: int, state_bytes: int,
           free_bytes: int) -> CheckpointingDecision:
    """``setting`` true/false is kept as set; null turns checkpointing on only when the micro-batch's activations
    exceed ``SHARE_OF_FREE`` of what is left once the training state is counted."""
    mib = 1 << 20
    sizes = (f"activations ~{activation_bytes / mib:,.0f} MiB per micro-batch, training state ~"
             f"{state_bytes / mib:,.0f} MiB, {free_bytes / mib:,.0f} MiB free")
    if setting is not None:
        return CheckpointingDecision(bool(setting), f"{field}={str(bool(setting)).lower()} ({sizes})")
    budget = SHARE_OF_FREE * max(0, free_bytes - state_bytes)
    enabled = activation_bytes > budget
    verdict = "exceed" if enabled else "fit in"
    return CheckpointingDecision(enabled, f"{field}=null decides: {sizes}; the activations {verdict} "
                                 f"{SHARE_OF_FREE:.0%} of what is left (set it true or false to choose)")


def micro_batch_tokens(use_dynamic_bsz: bool, max_token_len: int, micro_batch: int | None,
                       sequence: int) -> int:
    """The most tokens one training micro-batch can hold: the token budget under dynamic batching, else the
    micro-batch size times the longest sequence."""
    if use_dynamic_bsz:
        return int(max_token_len)
    return int(micro_batch or 1) * int(sequence)


def decide_for_module(module: Any, setting: bool | None, field: str, *, tokens: int, sequence: int,
                      dtype_bytes: int, device: str, dims: Any = None) -> CheckpointingDecision:
    """The decision for a loaded (not yet sharded) model ``module`` trained on ``dims``."""
    config = getattr(module, "config", None)
    base = getattr(module, "get_base_model", None)
    if config is None and callable(base):
        config = base().config
    eager = getattr(config, "_attn_implementation", None) == "eager"
    sp = int(getattr(dims, "sp", 1) or 1)
    tp = int(getattr(dims, "tp", 1) or 1)
    world = int(getattr(dims, "world", 1) or 1)
    pp = int(getattr(dims, "pp", 1) or 1)
    norms, qk_norms = layer_norms(module)
    activation = decoder_activation_bytes(config, tokens, sequence, dtype_bytes, sp=sp, tp=tp, eager=eager,
                                          norms=norms, qk_norms=qk_norms)
    n_params = sum(p.numel() for p in module.parameters())
    state = training_state_bytes(n_params, world) if pp == 1 else training_state_bytes(n_params // pp, world // pp)
    return decide(setting, field, activation_bytes=activation, state_bytes=state,
                  free_bytes=free_bytes_per_process(device))


def decide_for_role(module: Any, setting: bool | None, field: str, role: Any, fsdp_config: Any, *,
                    sequence: int | None, device: str, dims: Any) -> CheckpointingDecision:
    """The decision for a training role (``actor`` / ``critic`` node with its micro-batch keys) whose longest
    sequence is ``sequence`` (prompt + response length; None when the role cannot know it, then the role's token
    budget ``ppo_max_token_len_per_gpu`` bounds a micro-batch)."""
    from hybridflow.engine.device import resolve_dtype

    dtype = resolve_dtype(fsdp_config.mixed_precision.param_dtype or fsdp_config.model_dtype)
    budget = int(role.ppo_max_token_len_per_gpu)
    if sequence is None:
        tokens, sequence = budget, budget
    else:
        tokens = micro_batch_tokens(bool(role.use_dynamic_bsz), budget, role.ppo_micro_batch_size_per_gpu, sequence)
    return decide_for_module(module, setting, field, tokens=tokens, sequence=min(sequence, tokens),
                             dtype_bytes=dtype.itemsize, device=device, dims=dims)


def act_on(decision: CheckpointingDecision, module: Any, role: str, announce: bool) -> CheckpointingDecision:
    """Turn checkpointing on in ``module`` when decided, print the decision when ``announce`` (rank 0); returns it."""
    if decision.enabled:
        from hybridflow.engine.model_loader import enable_gradient_checkpointing

        enable_gradient_checkpointing(module)
    if announce:
        print(decision.line(role), flush=True)
    return decision

