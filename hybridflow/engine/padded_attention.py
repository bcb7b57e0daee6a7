"""Variable-length attention for a packed row where no varlen kernel exists (CPU, sdpa on GPU without flash-attn).

A packed micro-batch lays its N valid tokens end to end in one row (``engine/forward.py``), so the linear layers,
norms, rotary embedding and LM head -- most of a forward's and a backward's work -- see no padding at all.
flash-attention's varlen kernel then attends within each sequence.  Without it, transformers turns the packed row
into a dense block-diagonal N x N mask, and attention costs O(N^2) instead of O(sum L_i^2): more than the padding
saved.  This module keeps packing and pads only inside attention, which is cheap: each sequence's queries, keys
and values are copied into a right-padded (B, H, L_max, D) batch, sdpa runs with ``is_causal`` (a sequence starts
at column 0, so causal attention never reaches its padding), and the outputs are gathered back to the packed row.

The pad-inside-attention branch lives in the function transformers calls for ``sdpa`` (a wrapper registered with
``AttentionInterface`` through ``transformers_adapter.wrap_attention_function``, nesting with Ulysses' own; the
wrapped function is called for everything else): a forward that passes the pack's
layout as the keyword :data:`PACK_KWARG` takes the branch, any other call (a generation, another model's forward)
is transformers' sdpa, unchanged.  The layout travels as a keyword because transformers hands a model's keyword
arguments down to every attention call, and activation checkpointing keeps them for the recomputation in the
backward pass.  While :func:`padded_attention` is open, the ``sdpa`` mask function builds no mask for the packed
row (the padded batch is plain causal), which saves the N x N mask transformers would derive from the restarts.
Measured on this project's CPU (the step shape of ``bench_vs_trl.py``: 128 rows of 6-12 tokens, ~1M-parameter
Qwen2, one thread): forward + backward 101 ms trimmed (left padding cut to the longest row), 76 ms packed with
this attention, 132 ms packed with the dense mask.

Models it applies to (:func:`supports_padded_attention`): text models running sdpa, with no logit soft-capping and
no layers of another attention type (``layer_types``); a model-wide sliding window (Mistral's) shorter than a
sequence gets a banded causal mask on the padded batch.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from hybridflow.engine.transformers_adapter import (
    attention_implementation,
    forward_parameters,
    no_mask_while,
    text_config,
    unwrap_peft,
    wrap_attention_function,
    wrap_mask_function,
)

__all__ = ["PACK_KWARG", "PackLayout", "padded_attention", "supports_padded_attention"]

PACK_KWARG = "hybridflow_pack_layout"


@dataclass(frozen=True)
class PackLayout:
    """Where each token of the packed row sits in the right-padded batch: row ``rows[n]``, column ``cols[n]``."""

    rows: torch.Tensor  # (N,) long
    cols: torch.Tensor  # (N,) long
    batch: int
    width: int  # the longest sequence
    _bands: dict[int, torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, mask: torch.Tensor) -> "PackLayout":
        """The layout of ``mask``'s valid tokens (B, L bool, each row's valid tokens contiguous), packed row by row."""
        B, L = mask.shape
        lengths = mask.sum(dim=1)
        rows = torch.arange(B, device=mask.device)[:, None].expand(B, L)[mask]
        cols = (mask.cumsum(dim=1) - 1)[mask]
        return cls(rows=rows, cols=cols, batch=B, width=int(lengths.max()) if B else 0)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(1, H, N, D) packed -> (B, H, width, D), zeros after each sequence."""
        tokens = x[0].transpose(0, 1)  # (N, H, D)
        out = tokens.new_zeros(self.batch, self.width, tokens.shape[1], tokens.shape[2])
        out[self.rows, self.cols] = tokens
        return out.transpose(1, 2)

    def banded_mask(self, window: int) -> torch.Tensor:
        """(1, 1, width, width) causal mask that also hides keys ``window`` or more positions back (transformers'
        sliding-window convention); built once per pass, shared by its layers."""
        if window not in self._bands:
            pos = torch.arange(self.width, device=self.rows.device)
            distance = pos[:, None] - pos[None, :]
            self._bands[window] = ((distance >= 0) & (distance < window))[None, None]
        return self._bands[window]

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, width, H, D) attention output -> (1, N, H, D) packed."""
        return x[self.rows, self.cols].unsqueeze(0)


_PACKED_PASS: contextvars.ContextVar[bool] = contextvars.ContextVar("hybridflow_packed_pass", default=False)
_TAG = "hybridflow-padded-attention"


def _padded_sdpa(original: Callable) -> Callable:
    """transformers' sdpa function (``original``, possibly wrapped for Ulysses) with the pad-inside branch."""

    def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, *args: Any, **kwargs: Any):
        layout: PackLayout | None = kwargs.pop(PACK_KWARG, None)
        if layout is None:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        if query.shape[0] != 1 or query.shape[2] != int(layout.rows.numel()):
            raise RuntimeError(f"padded attention got queries of shape {tuple(query.shape)} for a pack of "
                               f"{int(layout.rows.numel())} tokens")
        window = kwargs.get("sliding_window")
        # a window shorter than a sequence needs a banded causal mask; otherwise sdpa's causal kernel, no mask
        mask = layout.banded_mask(int(window)) if window is not None and int(window) < layout.width else None
        kwargs["is_causal"] = mask is None
        out, weights = original(module, layout.pad(query), layout.pad(key), layout.pad(value), mask, *args, **kwargs)
        return layout.unpad(out), weights

    attention.__wrapped__ = original
    return attention


def _install() -> None:
    if wrap_attention_function("sdpa", _padded_sdpa, _TAG):
        wrap_mask_function("sdpa", no_mask_while(_PACKED_PASS), _TAG)  # the padded batch is plain causal


def supports_padded_attention(module: nn.Module) -> bool:
    """Whether ``module`` can run a packed row through :func:`padded_attention` (see the module docstring)."""
    base = unwrap_peft(module)
    config = getattr(base, "config", None)
    if config is None or attention_implementation(config) != "sdpa" or text_config(config) is not config:
        return False  # eager / flash models, and VLMs (their vision tower and M-RoPE rows keep their own layouts)
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types):
        return False
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return False
    return forward_parameters(type(base))[1]  # the layout reaches attention as a keyword


@contextlib.contextmanager
def padded_attention(mask: torch.Tensor) -> Iterator[dict[str, PackLayout]]:
    """For a forward of the packed row of ``mask``'s valid tokens (B, L): yields the keyword arguments to pass to
    the model (the pack's layout) and builds no attention mask while open.  The model must pass
    :func:`supports_padded_attention`."""
    _install()
    token = _PACKED_PASS.set(True)
    try:
        yield {PACK_KWARG: PackLayout.of(mask)}
    finally:
        _PACKED_PASS.reset(token)
