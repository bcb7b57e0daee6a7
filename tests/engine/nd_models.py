"""Tiny checkpoints of the decoder families the N-D engine splits, written from transformers configs directly.

Every model has 4 query heads and 64 hidden units over 2 layers, ``initializer_range=0.2`` (so attention,
positions and routing matter), and the char tokenizer.  The MoE ones have 4 experts, top-2 routing:
Qwen3-MoE (softmax router, normalised top-k) and DeepSeek-V3 (multi-head latent attention, a dense first
layer, sigmoid router with group-limited top-k, a shared expert).
"""

from __future__ import annotations

from pathlib import Path

FAMILIES = {
    # GQA, q/k/v biases, tied embeddings
    "qwen2": ("qwen2", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    # untied LM head
    "llama": ("llama", {"num_key_value_heads": 2, "tie_word_embeddings": False}),
    # per-head q/k norms, head_dim != hidden / heads
    "qwen3": ("qwen3", {"num_key_value_heads": 2, "head_dim": 24, "tie_word_embeddings": True}),
    "mistral": ("mistral", {"num_key_value_heads": 2, "tie_word_embeddings": False, "sliding_window": None}),
    "qwen3_moe": ("qwen3_moe", {"num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                "moe_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 1,
                                "tie_word_embeddings": False}),
    "deepseek_v3": ("deepseek_v3", {"num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16,
                                    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
                                    "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                                    "n_shared_experts": 1, "moe_intermediate_size": 32, "first_k_dense_replace": 1,
                                    "routed_scaling_factor": 1.5, "tie_word_embeddings": False}),
}


def write_model(path, family: str, seed: int = 0) -> str:
    """Write tokenizer + random-init ``family`` model to ``path``; returns the path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridflow.utils.tiny_model import build_char_tokenizer

    model_type, extra = FAMILIES[family]
    tok = build_char_tokenizer()
    fields = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512, initializer_range=0.2,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    fields.update(extra)
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if family == "deepseek_v3":  # a non-zero routing bias: the group-limited selection must use it
        with torch.no_grad():
            for module in model.modules():
                if hasattr(module, "e_score_correction_bias"):
                    module.e_score_correction_bias.copy_(torch.linspace(-0.05, 0.05, module.e_score_correction_bias.numel()))
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
