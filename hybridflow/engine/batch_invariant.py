"""Batch-invariant forward kernels: a token's arithmetic does not depend on the batch it is computed in.

Exact on-policy log-probs (``actor_rollout_ref.rollout.exact_log_probs``) need the rollout's cached decode -- one new
token per row against the KV cache, a few rows per matrix product -- to compute bit for bit what the trainer's
forward computes for the same token inside a micro-batch of thousands.  On CPU in fp32 four things differ today, each
measured here (``tests/engine/test_batch_invariant.py`` keeps them measured):

* **matrix products**: MKL's sgemm picks its kernel, and with more than one thread how it splits the reduction, by
  the product's shape, so a row's result moves in the last bits with the number of rows (any M < 16 with one thread;
  up to M = 300 and more with two).  MKL's conditional numerical reproducibility in *strict* mode
  (``MKL_CBWR=AUTO,STRICT``, :func:`enable_strict_matmul`) makes every row's result independent of M, of the other
  dimensions and of the thread count (measured for M = 1..2048).  It can only be switched on before the process's
  first MKL call: importing ``hybridflow`` sets ``MKL_CBWR`` (unless ``HYBRIDFLOW_STRICT_MATMUL=0`` or the variable is
  already set), which MKL reads at that call, and child processes inherit it;
* **attention**: sdpa's CPU flash kernel blocks queries and keys by the sequence lengths, and the decode step runs
  another kernel than the full forward.  :func:`invariant_attention` computes ``softmax(q k^T * s + mask) v`` with
  plain batched products whose results do not depend on the number of queries (2 or more) nor on masked keys
  after the last one, after moving every row's keys so that its first visible key is column 0 (left padding and
  packing then change nothing);
* **element-wise kernels**: ATen computes an element in the vectorised loop or in the scalar tail depending on where
  it lands in the tensor (and in a thread's share of it), and for ``rsqrt``, ``silu`` and ``sigmoid`` the two differ
  in the last bit.  :func:`mark_batch_invariant` gives the model's RMS norms ``x / sqrt(mean x^2 + eps)`` (a
  correctly rounded square root and division) and its SiLU ``x / (1 + exp(-x))``, whose kernels agree;
* **row reductions** (RMSNorm's mean, softmax, logsumexp over the vocabulary) reduce each row on its own in an order
  set by the row's length: already invariant.

Everything else in a Llama-family layer (embedding, rotary cos/sin, products by scalars, residual sums) is exact per
element.  What it costs is in ``benchmarks/RESULTS.md`` (section 21).  On GPU none of this holds: cuBLAS and the
attention kernels choose split-K and tile shapes by the batch, so exact log-probs there need batch-invariant GPU
kernels (``benchmarks/gpu/check_batch_invariance.py`` measures what is missing).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["INVARIANT_FLAG", "INVARIANT_MODEL_TYPES", "KEY_QUANTUM", "PACKED_CALL_KWARG", "batch_invariance_problem", "config_problem", "enable_strict_matmul", "invariant_attention",
           "invariant_rms_norm", "invariant_silu", "is_batch_invariant", "mark_batch_invariant", "strict_matmul"]

INVARIANT_FLAG = "hybridflow_batch_invariant"
PACKED_CALL_KWARG = "hybridflow_pack_layout"  # a packed row's attention call (engine/padded_attention.py handles it)
_MKL_CBWR_ALL, _MKL_CBWR_AUTO, _MKL_CBWR_STRICT = ~0, 2, 0x10000
_TAG = "hybridflow-batch-invariant"
KEY_QUANTUM = 16  # keys per attention product, rounded up to a multiple of this (fewer take another kernel)


# ---------------------------------------------------------------------------------------------- matrix products
def _mkl():
    """torch's MKL service functions (statically linked into libtorch_cpu), or None on a build without MKL."""
    lib_dir = Path(torch.__file__).parent / "lib"
    try:
        lib = ctypes.CDLL(str(lib_dir / "libtorch_cpu.so"))
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    set_.argtypes, set_.restype = [ctypes.c_int], ctypes.c_int
    return get, set_


def strict_matmul() -> bool:
    """Whether MKL runs in strict reproducibility mode in this process (every row of a product independent of the
    product's shape and of the thread count)."""
    mkl = _mkl()
    return mkl is not None and bool(mkl[0](_MKL_CBWR_ALL) & _MKL_CBWR_STRICT)


def enable_strict_matmul() -> bool:
    """Switch MKL's strict mode on; True when it is on.  Possible only before the process's first MKL call
    (``MKL_CBWR=AUTO,STRICT`` in the environment of a process does the same from its start), and not done with
    ``HYBRIDFLOW_STRICT_MATMUL=0``."""
    mkl = _mkl()
    if mkl is None:
        return False
    if strict_matmul():
        return True
    if os.environ.get("HYBRIDFLOW_STRICT_MATMUL", "1") == "0":  # the user turned it off
        return False
    mkl[1](_MKL_CBWR_AUTO | _MKL_CBWR_STRICT)
    return strict_matmul()


# ---------------------------------------------------------------------------------------------- element-wise kernels
def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm (normalise in fp32, cast back, scale) with ``1 / sqrt`` instead of ``rsqrt``."""
    h = x.to(torch.float32)
    h = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def invariant_silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU as ``x / (1 + exp(-x))``: ``exp``'s vectorised and scalar kernels agree, ``silu``'s do not."""
    return x / (1 + torch.exp(-x))


def _rms_forward(self, hidden_states):
    return invariant_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def _silu_forward(self, x):
    return invariant_silu(x)


def _is_rms_norm(m: nn.Module) -> bool:
    return type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon") and hasattr(m, "weight")


def _is_silu(m: nn.Module) -> bool:
    return isinstance(m, nn.SiLU) or type(m).__name__ == "SiLUActivation"


# ---------------------------------------------------------------------------------------------- the model
INVARIANT_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def config_problem(config) -> str | None:
    """Why a model of this Hugging Face ``config`` cannot run batch-invariantly here, or None (no weights needed)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in INVARIANT_MODEL_TYPES:
        return (f"model_type {model_type!r} is not one of {INVARIANT_MODEL_TYPES} (the layers whose kernels are made "
                "batch-invariant: RMSNorm, SiLU MLP, full attention)")
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (only SiLU is made batch-invariant)"
    windowed = getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None)
    if windowed or any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    impl = getattr(config, "_attn_implementation", None)
    if impl not in (None, "sdpa"):
        return f"attention implementation {impl!r} (exact mode replaces sdpa's kernel)"
    return None


def batch_invariance_problem(model: nn.Module) -> str | None:
    """Why ``model`` cannot run batch-invariantly here (then its log-probs are not exact), or None."""
    config = getattr(model, "config", None)
    if config is None:
        return "not a transformers model (no config)"
    problem = config_problem(config)
    if problem is not None:
        return problem
    if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in model.parameters()):
        return "parameters off the CPU or not fp32 (MKL's strict mode makes fp32 CPU products batch-invariant)"
    return None


def mark_batch_invariant(model: nn.Module) -> None:
    """Run ``model``'s RMS norms, SiLU and attention with the batch-invariant kernels of this module, from now on
    (the module objects are changed in place: every view of the model -- the rollout's, pipeline stages -- follows).
    The caller checks :func:`batch_invariance_problem` first."""
    install()
    for m in model.modules():
        if _is_rms_norm(m):
            m.forward = _rms_forward.__get__(m)
        elif _is_silu(m):
            m.forward = _silu_forward.__get__(m)
        m.__dict__[INVARIANT_FLAG] = True


def is_batch_invariant(module: nn.Module) -> bool:
    return bool(getattr(module, INVARIANT_FLAG, False))


# ---------------------------------------------------------------------------------------------- attention
def _first_key(allowed: torch.Tensor) -> torch.Tensor:
    """(B,) the first key column each row's last query may see (its left padding, or 0)."""
    last = allowed[:, 0, -1]  # (B, K)
    return last.to(torch.int8).argmax(dim=-1)


def _shift_left(x: torch.Tensor, shift: torch.Tensor, dim: int) -> torch.Tensor:
    """Row ``b`` of ``x`` moved ``shift[b]`` columns towards 0 along ``dim`` (the vacated tail is filled with the
    last column: it is masked out)."""
    n = x.shape[dim]
    idx = (torch.arange(n, device=x.device)[None, :] + shift[:, None]).clamp(max=n - 1)  # (B, n)
    view = [x.shape[0]] + [1] * (x.dim() - 1)
    view[dim] = n
    return x.gather(dim, idx.view(view).expand(*x.shape[:dim], n, *x.shape[dim + 1:]))


def invariant_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None,
                        scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale)`` over the allowed keys, times ``v``: (B, H, Lq, D) for queries (B, H, Lq, D) and
    keys / values (B, Hkv, Lk, D); ``allowed`` (B or 1, 1, Lq, Lk) bool, or None for causal attention with Lq = Lk.

    Each row's keys are moved so that the first key its last query sees is column 0 (the visible keys of every query
    must be one run starting there: left padding, packing, a cache), the keys are padded with masked ones to a
    multiple of :data:`KEY_QUANTUM`, the query heads of one key head form the rows of one product (no copy of the
    keys and values; at least two rows), and masked keys contribute exact zeros -- so a query's result does not depend
    on the batch, the padding or the number of queries computed with it.  A query that sees no key gets zeros."""
    B, H, Lq, D = query.shape
    Hkv, Lk = key.shape[1], key.shape[2]
    rep = H // Hkv
    if allowed is None:
        allowed = torch.ones(Lq, Lk, dtype=torch.bool, device=query.device).tril(Lk - Lq)[None, None]
    allowed = allowed.expand(B, 1, Lq, Lk)
    shift = _first_key(allowed)
    if bool((shift > 0).any()):
        key, value = _shift_left(key, shift, 2), _shift_left(value, shift, 2)
        allowed = _shift_left(allowed, shift, 3) & (torch.arange(Lk, device=query.device) < Lk - shift[:, None]
                                                    )[:, None, None, :]
    pad = -Lk % KEY_QUANTUM  # short key runs take other product kernels: masked zero keys up to the quantum
    if pad:
        key, value = F.pad(key, (0, 0, 0, pad)), F.pad(value, (0, 0, 0, pad))
        allowed = F.pad(allowed, (0, pad), value=False)
    K = key.shape[2]
    rows = rep * Lq
    q = query.reshape(B, Hkv, rows, D)  # the query heads of key head j are rows j*rep .. (j+1)*rep - 1
    if rows == 1:  # a one-row product takes another kernel
        q = torch.cat([q, q], dim=2)
    scores = torch.matmul(q, key.transpose(-1, -2))[:, :, :rows] * scale
    hidden = ~allowed[:, :, None]  # (B, 1, 1, Lq, K)
    scores = scores.view(B, Hkv, rep, Lq, K).masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    blind = hidden.all(dim=-1, keepdim=True)
    if bool(blind.any()):  # queries that see no key (padding): zeros, not NaN
        probs = probs.masked_fill(blind, 0.0)
    p = probs.view(B, Hkv, rows, K)
    if rows == 1:
        p = torch.cat([p, p], dim=2)
    return torch.matmul(p, value)[:, :, :rows].reshape(B, H, Lq, D)


def _allowed(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return mask
    return mask == 0  # additive masks: 0 = attend, -inf = not


def _invariant_sdpa(original):
    """transformers' sdpa attention function with the batch-invariant kernel for marked modules."""

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        if (not is_batch_invariant(module) or dropout or kwargs.get("sliding_window") or kwargs.get("softcap")
                or kwargs.get(PACKED_CALL_KWARG) is not None):
            return original(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        if mask is None and not (causal and query.shape[2] > 1):
            mask = torch.ones(1, 1, query.shape[2], key.shape[2], dtype=torch.bool, device=query.device)
        out = invariant_attention(query, key, value, _allowed(mask, query, key), scale)
        return out.transpose(1, 2).contiguous(), None

    attention.__wrapped__ = original
    return attention


def install() -> None:
    """Register the batch-invariant branch of transformers' ``sdpa`` attention function, once.  A packed row's call
    goes on to ``engine/padded_attention.py``, which computes the padded batch with :func:`invariant_attention`
    itself on a marked model (whichever of the two wrappers is outside)."""
    from hybridflow.engine.transformers_adapter import wrap_attention_function

    wrap_attention_function("sdpa", _invariant_sdpa, _TAG)

