"""A lean decode step for Llama-family decoders (Llama, Qwen2, Qwen3, Mistral), and
the language model of Qwen2-VL / Qwen2.5-VL (decoded tokens are text: their three M-RoPE axes are equal, so the
model's own rotary embedding of a 1-D position -- the engine passes ``column + rope_delta`` -- is exact).

Why: a decode step feeds one token per row.  For the small models this project trains on CPU, the
arithmetic of that step is a few hundred microseconds while transformers' ``forward`` spends milliseconds
in Python around it (module dispatch, keyword plumbing, mask utilities, output dataclasses): measured on
the 0.4 M-parameter ``tiny`` model at 16 rows, ~2-3 ms per step through ``model(...)``.  This module runs
the same computation as a flat sequence of tensor ops over the model's *own* parameters, read at call
time (nothing is copied, so weights updated by the actor are used at once), with the engine's
:class:`~hybridflow.rollout.hf.kv_cache.SlotKVCache` as the cache.  Prefill still goes through the model's
``forward`` (it is one call per batch and its cost is arithmetic).

It is used only when the model is exactly the supported structure -- every projection a plain
``nn.Linear``, RMS norms, rotary embeddings, no sharded (DTensor) or adapter (LoRA) weights -- and otherwise
the engine falls back to ``model(...)`` (and says why once, see :func:`fast_decoder_for`).  Sliding-window
layers (Mistral-7B-v0.1, Qwen2 with ``use_sliding_window``) are supported: the step attends with each layer's
own mask from :class:`~hybridflow.rollout.hf.attention_masks.EngineMasks`.
Equality with the ``forward`` path is tested (tokens, and log-probs within 1e-5).

On CPU in fp32 the step's Linear layers run on oneDNN with the weights reordered ("prepacked") once into
its blocked layout (:class:`PackedLinears`), as vLLM's CPU backend does: torch's ``F.linear`` goes through
MKL sgemm and repacks its operand on every call, which at decode shapes (a few to a few hundred rows) costs
1.1-1.8x the packed matmul (``benchmarks/bench_engines.py``) -- for weights of 2^18 elements and more; smaller
ones (hidden sizes below ~400) stay on ``F.linear``, which is faster there. The packed copies are refreshed when a weight
changes (its version counter or storage moves, i.e. after every optimizer step of the shared actor module),
so the step always reads the current weights; outputs equal ``F.linear``'s to ~1e-6 relative.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hybridflow.engine.batch_invariant import invariant_attention, invariant_rms_norm, is_batch_invariant
from hybridflow.engine.transformers_adapter import attention_implementation, attention_mask_layout, text_config

__all__ = ["FastDecoder", "PackedLinears", "fast_decoder_for", "SUPPORTED_MODEL_TYPES"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_vl", "qwen2_5_vl")
# Why the families hybridflow is tested on, but the step does not compute, differ from the Llama structure.
_KNOWN_DIFFERENCES = {
    "gemma2": "Gemma-2 layers (soft-capped attention and final logits, query_pre_attn_scalar, (1 + w) RMS norms, "
              "sqrt(hidden)-scaled embeddings, extra post-norms)",
    "deepseek_v3": "DeepSeek-V3 layers (MLA attention with low-rank compressed queries and keys/values, K and V "
                   "head dims that differ; MoE feed-forward layers)",
    "qwen3_moe": "Qwen3-MoE feed-forward layers (a top-k router over experts instead of one MLP)",
}
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def _rms(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """transformers' RMSNorm: normalise in fp32, cast back, scale by the weight (the batch-invariant one on a model
    marked by ``engine/batch_invariant.py``)."""
    if is_batch_invariant(norm):
        return invariant_rms_norm(x, norm.weight, norm.variance_epsilon)
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


def _unsupported_reason(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        known = _KNOWN_DIFFERENCES.get(model_type)
        return known or f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    impl = attention_implementation(config)
    config = text_config(config)
    if impl not in ("sdpa", "eager"):
        return f"attention implementation {impl!r}"
    layout = attention_mask_layout(config)
    if layout.unsupported:
        return layout.unsupported
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


def _onednn_linear_available() -> bool:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")
            and hasattr(mkldnn, "_linear_pointwise"))


# Weights with fewer elements stay on F.linear: the packed oneDNN call has a fixed cost of ~15-20 us that only
# a large enough matmul repays.  Measured per call, one thread, 16 and 128 rows (2026-11-25, this VM): packed /
# F.linear 1.1-4.6x at 64x64 .. 192x576 (the 1 M-parameter step-shape model: every weight), ~1.0 at 384x384,
# 0.73-0.95 at 512x512 and above; a repack after each optimizer step costs 0.1-0.5 ms per weight on top.
PACK_MIN_ELEMENTS = 1 << 18


class PackedLinears:
    """oneDNN-prepacked copies of a set of CPU fp32 ``nn.Linear`` weights, repacked when a weight changes.

    ``linear(module, x)`` is ``F.linear(x, module.weight, module.bias)``; modules outside the set, modules whose
    weight has fewer than ``min_elements`` elements (see :data:`PACK_MIN_ELEMENTS`), or any call when packing is
    off, go through ``F.linear``.  ``enabled`` is False when no module is packed.
    """

    def __init__(self, modules: list[nn.Module], rows_hint: int = 64, min_elements: int = PACK_MIN_ELEMENTS):
        modules = [m for m in modules if m.weight.numel() >= min_elements]
        self.enabled = bool(modules) and _onednn_linear_available() and all(
            m.weight.device.type == "cpu" and m.weight.dtype == torch.float32 for m in modules)
        self.rows_hint = rows_hint
        self._modules = modules if self.enabled else []
        self._packed: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}
        self._weights_stamp: object = None

    def refresh(self, weights_stamp: object = None) -> None:
        """Repack the weights that changed since the last call (all of them the first time). A weight changed
        when its storage or version counter moved, or -- fused optimizer kernels update in place without
        bumping version counters -- when ``weights_stamp`` (the batcher's per-step fingerprint of the
        model's weights, values included) differs from the last call's: then every weight is repacked."""
        if not self.enabled:
            return
        everything = weights_stamp is not None and weights_stamp != self._weights_stamp
        self._weights_stamp = weights_stamp
        for m in self._modules:
            w = m.weight
            stamp = (w._version, w.data_ptr())
            held = self._packed.get(id(m))
            if everything or held is None or held[0] != stamp:
                with torch.no_grad():
                    self._packed[id(m)] = (stamp, torch.ops.mkldnn._reorder_linear_weight(w.detach(), self.rows_hint))

    def linear(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        held = self._packed.get(id(module)) if self.enabled else None
        # bf16 compute (activations, or autocast, which the oneDNN op does not follow): the plain matmul
        if held is None or x.dtype != torch.float32 or torch.is_autocast_enabled(x.device.type):
            return F.linear(x, module.weight, module.bias)
        return torch.ops.mkldnn._linear_pointwise(x, held[1], module.bias, "none", [], "")


class FastDecoder:
    """One decode step: (B,) next tokens at (B,) positions -> (B, V) logits, writing K/V into the cache."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.body = _decoder(model)
        self.layers = list(self.body.layers)
        config = text_config(model.config)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.mask_keys = attention_mask_layout(config).layer_keys  # each layer's mask when masks come keyed
        linears = [getattr(layer.self_attn, n) for layer in self.layers for n in _PROJECTIONS]
        linears += [getattr(layer.mlp, n) for layer in self.layers for n in _MLP]
        # batch-invariant (exact log-probs): every product through F.linear, whose rows MKL's strict mode keeps
        # independent of the batch -- the oneDNN packed kernels are another arithmetic than the trainer's
        self.invariant = is_batch_invariant(model)
        self.packed = PackedLinears([] if self.invariant else linears + [model.lm_head])

    def usable(self) -> bool:
        """False while the weights are sharded (FSDP DTensors outside an unshard): use ``forward`` then."""
        return type(self.model.lm_head.weight) in (nn.Parameter, torch.Tensor)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache, mask: "torch.Tensor | dict[str, torch.Tensor]",
             weights_stamp: object = None) -> torch.Tensor:
        """``mask``: one (B, 1, 1, K) mask for every layer, or ``{layer type: mask}`` (sliding-window layers).
        ``weights_stamp``: a fingerprint of the weights that changes when they do (see ``PackedLinears``)."""
        B = tokens.shape[0]
        self.packed.refresh(weights_stamp)
        lin = self.packed.linear
        h = self.body.embed_tokens(tokens[:, None])  # (B, 1, H)
        cos, sin = self.body.rotary_emb(h, positions[:, None])  # (B, 1, head_dim) each
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        gqa = self.num_heads != self.num_kv_heads
        for i, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            x = _rms(h, layer.input_layernorm)
            q = lin(attn.q_proj, x).view(B, 1, self.num_heads, self.head_dim)
            k = lin(attn.k_proj, x).view(B, 1, self.num_kv_heads, self.head_dim)
            v = lin(attn.v_proj, x).view(B, 1, self.num_kv_heads, self.head_dim)
            if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head before the rotation
                q, k = _rms(q, attn.q_norm), _rms(k, attn.k_norm)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            keys, values = cache.update(k, v, i)
            layer_mask = mask[self.mask_keys[i]] if isinstance(mask, dict) else mask
            if self.invariant:
                o = invariant_attention(q, keys, values, layer_mask == 0, attn.scaling)
            else:
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=layer_mask, scale=attn.scaling,
                                                   enable_gqa=gqa)
            h = h + lin(attn.o_proj, o.transpose(1, 2).reshape(B, 1, -1))
            x = _rms(h, layer.post_attention_layernorm)
            h = h + lin(mlp.down_proj, mlp.act_fn(lin(mlp.gate_proj, x)) * lin(mlp.up_proj, x))
        h = _rms(h, self.body.norm)
        return lin(self.model.lm_head, h)[:, -1]


def fast_decoder_for(model: nn.Module) -> tuple[FastDecoder | None, str | None]:
    """``(decoder, None)`` when ``model`` has the supported structure, else ``(None, reason)``."""
    reason = _unsupported_reason(model)
    return (None, reason) if reason else (FastDecoder(model), None)
