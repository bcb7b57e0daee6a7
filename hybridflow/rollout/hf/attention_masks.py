"""The ``hf`` engine's attention masks with each layer type's sliding window built in.

The engine hands the model explicit 4-D additive masks (prefill over padded chunks, decode over per-row cache
columns), and transformers uses a 4-D mask as given: it never adds a model's sliding window to it.  Models with
sliding-window layers (Mistral-7B-v0.1, Gemma-2's alternating layers, Qwen2/Qwen3 with ``use_sliding_window``)
would then attend over the whole sequence -- silently wrong outputs once a sequence outgrows the window.  So the
masks are built here per mask name of :func:`~hybridflow.engine.transformers_adapter.attention_mask_layout`:
a key at position ``k`` is visible from a query at position ``q`` iff it is visible without a window and
``q - k < window``.  Positions are cache columns (a row's token ``i`` sits in column ``i``), which are the
sequence positions the window is defined over (for M-RoPE models too: the rotary offset does not move them).

Models without windows get the plain tensor they always got; models with windows get a ``{name: mask}`` dict
(``keyed`` layouts) or their single windowed mask.
"""

from __future__ import annotations

import torch

from hybridflow.engine.transformers_adapter import AttentionMaskLayout

__all__ = ["EngineMasks"]


class EngineMasks:
    """Turns the engine's window-free masks into what the model's layers need."""

    def __init__(self, layout: AttentionMaskLayout):
        if layout.unsupported:
            raise ValueError(f"the hf rollout engine cannot build attention masks for this model: {layout.unsupported}")
        self.layout = layout

    @property
    def windowed(self) -> bool:
        return self.layout.has_windows

    def _pack(self, build) -> "torch.Tensor | dict[str, torch.Tensor]":
        masks = {name: build(window) for name, window in self.layout.windows.items()}
        if self.layout.keyed:
            return masks
        (only,) = masks.values()
        return only

    def prefill(self, allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, valid: torch.Tensor,
                dtype: torch.dtype):
        """(U, 1, W, K) additive mask(s) of a prefill forward.

        ``allowed`` (U, W, K) bool: what each query slot may see without a window; ``q_pos`` (U, W) the
        queries' positions; ``k_pos`` (U, K) or (K,) the keys' positions; ``valid`` (U, W) real query slots
        (padded query slots keep ``allowed`` as is, so that no softmax row is empty)."""
        k = k_pos if k_pos.dim() == 2 else k_pos[None]

        def build(window: int | None) -> torch.Tensor:
            ok = allowed
            if window is not None:
                ok = allowed & ((q_pos[:, :, None] - k[:, None, :] < window) | ~valid[:, :, None])
            return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill_(~ok, float("-inf"))[:, None]

        return self._pack(build)

    def decode(self, row_mask: torch.Tensor, write_cols: torch.Tensor):
        """(B, 1, 1, K) mask(s) of a decode step from the cache's row mask; the query of row ``b`` is the token
        written at column ``write_cols[b]``."""
        if not self.windowed:
            return row_mask
        cols = torch.arange(row_mask.shape[-1], device=row_mask.device)

        def build(window: int | None) -> torch.Tensor:
            if window is None:
                return row_mask
            far = (cols[None, :] <= (write_cols - window)[:, None])[:, None, None, :]
            return row_mask.masked_fill(far, float("-inf"))

        return self._pack(build)
