"""A lean decode step for Llama-family decoders (Llama, Qwen2, Qwen3, Mistral without sliding windows), and
the language model of Qwen2-VL / Qwen2.5-VL (decoded tokens are text: their three M-RoPE axes are equal, so the
model's own rotary embedding of a 1-D position -- the engine passes ``column + rope_delta`` -- is exact).

Why: a decode step feeds one token per row.  For the small models this project trains on CPU, the
arithmetic of that step is a few hundred microseconds while transformers' ``forward`` spends milliseconds
in Python around it (module dispatch, keyword plumbing, mask utilities, output dataclasses): measured on
the 0.4 M-parameter ``tiny`` model at 16 rows, ~2-3 ms per step through ``model(...)``.  This module runs
the same computation as a flat sequence of tensor ops over the model's *own* parameters, read at call
time (nothing is copied, so weights updated by the actor are used at once), with the engine's
:class:`~hybridflow.rollout.kv_cache.SlotKVCache` as the cache.  Prefill still goes through the model's
``forward`` (it is one call per batch and its cost is arithmetic).

It is used only when the model is exactly the supported structure -- every projection a plain
``nn.Linear``, RMS norms, rotary embeddings, no sliding-window layers, no sharded (DTensor) or adapter
(LoRA) weights -- and otherwise the engine falls back to ``model(...)``; :func:`fast_decoder_for` says why.
Equality with the ``forward`` path is tested (tokens, and log-probs within 1e-5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FastDecoder", "fast_decoder_for", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_vl", "qwen2_5_vl")
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _rms(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' RMSNorm: normalise in fp32, cast back, scale by the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _decoder(model: nn.Module) -> nn.Module | None:
    """The module holding embed_tokens / layers / norm / rotary_emb (a VLM's language model)."""
    body = getattr(model, "model", None)
    return getattr(body, "language_model", None) or body


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _unsupported_reason(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    config = _text_config(config)
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
        return f"attention implementation {config._attn_implementation!r}"
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    if model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        return "Mistral sliding window"
    body = _decoder(model)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if body is None or not all(hasattr(body, n) for n in needed) or not hasattr(model, "lm_head"):
        return "not a <Model>ForCausalLM with model.{embed_tokens,layers,norm,rotary_emb} and lm_head"
    linears = [model.lm_head]
    for layer in body.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return "a decoder layer without self_attn/mlp"
        linears += [getattr(attn, n, None) for n in _PROJECTIONS] + [getattr(mlp, n, None) for n in _MLP]
        norms = [getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)]
        norms += [getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if not all(n is not None and hasattr(n, "variance_epsilon") for n in norms):
            return "a norm that is not an RMSNorm"
    if not all(type(m) is nn.Linear for m in linears):  # LoRA / quantised layers change the maths
        return "projections that are not plain nn.Linear (e.g. LoRA adapters)"
    return None


class FastDecoder:
    """One decode step: (B,) next tokens at (B,) positions -> (B, V) logits, writing K/V into the cache."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.body = _decoder(model)
        self.layers = list(self.body.layers)
        config = _text_config(model.config)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads

    def usable(self) -> bool:
        """False while the weights are sharded (FSDP DTensors outside an unshard): use ``forward`` then."""
        return type(self.model.lm_head.weight) in (nn.Parameter, torch.Tensor)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor) -> torch.Tensor:
        B = tokens.shape[0]
        h = self.body.embed_tokens(tokens[:, None])  # (B, 1, H)
        cos, sin = self.body.rotary_emb(h, positions[:, None])  # (B, 1, head_dim) each
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        gqa = self.num_heads != self.num_kv_heads
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms(h, layer.input_layernorm)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(B, 1, self.num_heads, self.head_dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(B, 1, self.num_kv_heads, self.head_dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(B, 1, self.num_kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head before the rotation
                q, k = _rms(q, attn.q_norm), _rms(k, attn.k_norm)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.update(k, v, i)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=gqa)
            h = h + F.linear(o.transpose(1, 2).reshape(B, 1, -1), attn.o_proj.weight, attn.o_proj.bias)
            x = _rms(h, layer.post_attention_layernorm)
            gate = F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)
            up = F.linear(x, mlp.up_proj.weight, mlp.up_proj.bias)
            h = h + F.linear(mlp.act_fn(gate) * up, mlp.down_proj.weight, mlp.down_proj.bias)
        h = _rms(h, self.body.norm)
        return self.model.lm_head(h)[:, -1]


def fast_decoder_for(model: nn.Module) -> tuple[FastDecoder | None, str | None]:
    """``(decoder, None)`` when ``model`` has the supported structure, else ``(None, reason)``."""
    reason = _unsupported_reason(model)
    return (None, reason) if reason else (FastDecoder(model), None)
