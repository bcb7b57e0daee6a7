"""Model FLOPs utilisation (MFU): analytic training FLOPs of a decoder-only transformer ÷ device peak.

The FLOP count follows the usual dense-transformer estimate (Kaplan et al. 2020, "Scaling Laws for
Neural Language Models", §2.1; Narayanan et al. 2021, Megatron-LM, appendix): a forward+backward pass
costs 6 FLOPs per parameter per token for every matmul weight, plus the attention score/value products,
6 · Σ_i seqlen_i² · head_dim · n_heads per layer (fwd 2·(QKᵀ + AV) = 4·s²·d, bwd twice that, causal
masking not discounted). Parameters counted are those of llama/qwen2/qwen3/mistral-style blocks
(q,k,v,o projections with grouped KV heads, a gated 3-matrix MLP) plus embedding and LM head, the same
convention as verl's ``FlopsCounter`` so MFU numbers are comparable between the two.

The peak is the dense bf16 tensor-core peak for GPUs (vendor datasheets) and, on CPU, a measured fp32
matmul rate (``measure_cpu_peak_flops``): a CPU has no meaningful datasheet number for this use and the
sustained matmul rate is what training can reach at best.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import torch

__all__ = ["FlopsCounter", "estimate_flops", "count_dense_params", "get_device_peak_flops", "measure_cpu_peak_flops"]

# Dense bf16 peak FLOP/s per device (no sparsity), from vendor datasheets. Keys are matched as
# substrings of the device name (``torch.cuda.get_device_name()``), most specific first.
_GPU_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("B100", 1.75e15),
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("H20", 148e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L20", 119.5e12),
    ("L4", 121e12),
    ("A40", 149.7e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("V100", 125e12),
    ("MI355X", 2.5e15),
    ("MI325X", 1307e12),
    ("MI300X", 1307e12),
    ("MI250X", 383e12),
    ("910B", 354e12),
)

_SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "olmo2", "internlm2", "gemma2")
_REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def _field(config: Any, name: str, default: Any = None) -> Any:
    """Read an HF config attribute or dict key (configs arrive as either)."""
    if isinstance(config, dict):
        return config.get(name, default)
    return getattr(config, name, default)


def _text_config(config: Any) -> Any:
    """Vision-language configs keep the decoder's sizes in ``text_config``."""
    text = _field(config, "text_config")
    return text if text is not None and _field(config, "hidden_size") is None else config


def count_dense_params(model_config: Any) -> tuple[int, dict[str, int]]:
    """Matmul parameters of a llama-style decoder, and the sizes the attention term needs.

    Returns ``(n_params, {"layers", "heads", "head_dim"})``. Raises ``ValueError`` naming the missing field
    for configs that are not decoder-only transformers of this shape.
    """
    cfg = _text_config(model_config)
    missing = [f for f in _REQUIRED_FIELDS if _field(cfg, f) is None]
    if missing:
        raise ValueError(
            f"Cannot estimate FLOPs: model config (model_type={_field(cfg, 'model_type')!r}) lacks {missing}. "
            f"MFU is estimated for decoder-only configs like {', '.join(_SUPPORTED_MODEL_TYPES)}."
        )
    hidden = int(_field(cfg, "hidden_size"))
    heads = int(_field(cfg, "num_attention_heads"))
    kv_heads = int(_field(cfg, "num_key_value_heads") or heads)
    head_dim = int(_field(cfg, "head_dim") or hidden // heads)
    layers = int(_field(cfg, "num_hidden_layers"))
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    attn_linear = hidden * (q_size + 2 * kv_size) + q_size * hidden  # q, k, v in; o out
    mlp = 3 * hidden * int(_field(cfg, "intermediate_size"))  # gate, up, down
    embed_and_head = 2 * int(_field(cfg, "vocab_size")) * hidden
    n_params = layers * (attn_linear + mlp) + embed_and_head
    return n_params, {"layers": layers, "heads": heads, "head_dim": head_dim}


def estimate_flops(model_config: Any, batch_seqlens: Sequence[int], delta_time: float) -> float:
    """Achieved training FLOP/s for one forward+backward over sequences of lengths ``batch_seqlens``.

    FLOPs = 6 · N · Σ seqlen + 6 · Σ seqlen² · layers · heads · head_dim, divided by ``delta_time`` seconds.
    """
    if delta_time <= 0:
        raise ValueError(f"delta_time must be > 0 seconds, got {delta_time}")
    n_params, dims = count_dense_params(model_config)
    seqlens = [int(s) for s in batch_seqlens]
    dense = 6 * n_params * sum(seqlens)
    attention = 6 * sum(s * s for s in seqlens) * dims["layers"] * dims["heads"] * dims["head_dim"]
    return (dense + attention) / delta_time


def get_device_peak_flops(device_name: str | None = None) -> float:
    """Peak FLOP/s of one device: the GPU table for accelerator names, a measured matmul rate for ``"cpu"``.

    ``device_name=None`` detects the current device (first CUDA device, else CPU). An unknown GPU gives
    ``inf`` (MFU then reads 0, an obvious "unknown" rather than a wrong number).
    """
    if device_name is None:
        device_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    if device_name.lower() == "cpu":
        return measure_cpu_peak_flops()
    upper = device_name.upper()
    for key, peak in _GPU_PEAK_FLOPS:
        if key.upper() in upper:
            return peak
    return float("inf")


@functools.lru_cache(maxsize=4)
def _cpu_peak(num_threads: int, size: int, repeats: int) -> float:
    a = torch.randn(size, size, dtype=torch.float32)
    b = torch.randn(size, size, dtype=torch.float32)
    torch.mm(a, b)  # warm-up: first call pays for allocation and kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def measure_cpu_peak_flops(size: int = 512, repeats: int = 5) -> float:
    """Best-of-``repeats`` fp32 ``size×size`` matmul rate (FLOP/s) with the current torch thread count.

    Cached per (threads, size, repeats): the probe costs ~10-50 ms once per process. The best time, not the
    mean, because the question is what the hardware can do, and shared machines only ever add delay.
    """
    if size < 16 or repeats < 1:
        raise ValueError(
            f"measure_cpu_peak_flops needs size >= 16 and repeats >= 1, got size={size}, repeats={repeats}"
        )
    return _cpu_peak(torch.get_num_threads(), size, repeats)


class FlopsCounter:
    """MFU for one model on one kind of device: ``mfu(seqlens, seconds, n_devices)``.

    ``passes`` counts forward+backward sweeps over the same tokens (``ppo_epochs``): the update stage
    does that much more work in the measured time.
    """

    def __init__(self, model_config: Any, device_name: str | None = None):
        self.model_config = model_config
        count_dense_params(model_config)  # fail early, naming the missing field
        self.peak_flops = get_device_peak_flops(device_name)

    def estimate_flops(self, batch_seqlens: Sequence[int], delta_time: float) -> tuple[float, float]:
        """(achieved FLOP/s over all devices, peak FLOP/s of one device)."""
        return estimate_flops(self.model_config, batch_seqlens, delta_time), self.peak_flops

    def mfu(self, batch_seqlens: Sequence[int], delta_time: float, n_devices: int = 1, passes: int = 1) -> float:
        if n_devices < 1:
            raise ValueError(f"n_devices must be >= 1, got {n_devices}")
        achieved, peak = self.estimate_flops(batch_seqlens, delta_time)
        return achieved * passes / (peak * n_devices)
