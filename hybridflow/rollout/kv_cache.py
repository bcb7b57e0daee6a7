"""A preallocated slot KV cache that HF attention layers write into in place.

Why not ``DynamicCache``: it concatenates every step (copying the whole cache per layer per token) and
makes all rows share one length, so finished rows cannot leave and new requests cannot join.  Here each
layer owns ``(max_rows, kv_heads, capacity, head_dim)`` buffers allocated once; row ``b`` writes its next
token at its own column ``write_cols[b]``, and an additive mask row (0 = attend, -inf = padding / not yet
written) says which columns it may read.  Attention reads only the first ``kv_len`` columns.

HF attention modules only call ``past_key_values.update(k, v, layer_idx)``, so this duck-typed object
works for every decoder in transformers that uses the standard attention interface (Llama, Qwen2,
Mistral, ...).  Buffers are allocated lazily from the first prefill's key shapes, so no architecture
knowledge (head counts, head_dim) is needed.
"""

from __future__ import annotations

import torch

__all__ = ["SlotKVCache"]


class SlotKVCache:
    """Per-layer K/V buffers plus the per-row attention mask, with per-row write columns."""

    def __init__(self, max_rows: int, capacity: int, mask_dtype: torch.dtype, device: torch.device):
        if max_rows < 1 or capacity < 1:
            raise ValueError(f"SlotKVCache needs max_rows >= 1 and capacity >= 1, got {max_rows}, {capacity}")
        self.max_rows = max_rows
        self.capacity = capacity
        self.device = device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        # Additive attention mask per row and column; -inf until a column holds a real token.
        self.mask = torch.full((max_rows, capacity), float("-inf"), dtype=mask_dtype, device=device)
        self.n_rows = 0
        self.kv_len = 0
        self._mode = "idle"
        self._prefill_rows = (0, 0)
        self._write_cols: torch.Tensor | None = None
        self._source_rows: torch.Tensor | None = None
        self._row_index = torch.arange(max_rows, device=device)

    # ------------------------------------------------------------------ called by HF attention
    def update(self, key_states, value_states, layer_idx: int, cache_kwargs=None):
        """Store this step's K/V of layer ``layer_idx`` and return the K/V the layer attends over."""
        if layer_idx == len(self.keys):  # first prefill: allocate from the real shapes
            self._allocate_layer(key_states, value_states)
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        if self._mode == "prefill":
            r0, r1 = self._prefill_rows
            width = key_states.shape[2]
            src = self._source_rows
            k_buf[r0:r1, :, :width] = key_states if src is None else key_states[src]
            v_buf[r0:r1, :, :width] = value_states if src is None else value_states[src]
            return key_states, value_states
        if self._mode != "decode":
            raise RuntimeError("SlotKVCache.update called outside begin_prefill()/begin_decode()")
        n = self.n_rows
        rows = self._row_index[:n]
        k_buf[rows, :, self._write_cols] = key_states[:, :, 0]
        v_buf[rows, :, self._write_cols] = value_states[:, :, 0]
        return k_buf[:n, :, : self.kv_len], v_buf[:n, :, : self.kv_len]

    def _allocate_layer(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, kv_heads, _, k_dim = key_states.shape
        v_dim = value_states.shape[-1]
        shape = (self.max_rows, kv_heads, self.capacity)
        self.keys.append(torch.zeros(*shape, k_dim, dtype=key_states.dtype, device=key_states.device))
        self.values.append(torch.zeros(*shape, v_dim, dtype=value_states.dtype, device=value_states.device))

    # ------------------------------------------------------------------ called by the engine
    def begin_prefill(self, row_start: int, start_cols: torch.Tensor, width: int,
                      source_rows: torch.Tensor | None = None) -> None:
        """Next forward writes ``len(start_cols)`` new rows from ``row_start``; row i's prompt is left
        padded, occupying columns ``[start_cols[i], width)``.  With ``source_rows`` the forward runs over
        fewer (distinct) prompts and row i takes the K/V of forward row ``source_rows[i]`` (shared prefill)."""
        r1 = row_start + start_cols.shape[0]
        if r1 > self.max_rows or width > self.capacity:
            raise ValueError(f"prefill of rows [{row_start}, {r1}) x {width} columns exceeds the cache "
                             f"({self.max_rows} rows x {self.capacity} columns)")
        self._mode, self._prefill_rows, self._source_rows = "prefill", (row_start, r1), source_rows
        cols = torch.arange(self.capacity, device=self.device)
        valid = (cols[None, :] >= start_cols[:, None]) & (cols[None, :] < width)
        self.mask[row_start:r1] = torch.where(valid, 0.0, float("-inf")).to(self.mask.dtype)

    def begin_decode(self, write_cols: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Next forward writes one token per row at ``write_cols``; returns the (B, 1, 1, kv_len) mask."""
        n = write_cols.shape[0]
        self._mode, self.n_rows, self._write_cols, self.kv_len = "decode", n, write_cols, kv_len
        self.mask[self._row_index[:n], write_cols] = 0.0
        return self.mask[:n, None, None, :kv_len]

    def end(self) -> None:
        self._mode, self._write_cols, self._source_rows = "idle", None, None

    def keep_rows(self, keep: torch.Tensor, used_cols: int) -> None:
        """Compact: rows ``keep`` (in order) move to the front; only the first ``used_cols`` columns are
        copied because nothing beyond them was written yet."""
        k = keep.shape[0]
        for buf in (*self.keys, *self.values):
            buf[:k, :, :used_cols] = buf[keep, :, :used_cols]
        self.mask[:k] = self.mask[keep]
        self.n_rows = k

    def grow(self, capacity: int) -> None:
        """Reallocate with more columns, keeping what was written (rare: a longer request joined)."""
        if capacity <= self.capacity:
            return
        old = self.capacity

        def widen(buf: torch.Tensor) -> torch.Tensor:
            rows, heads, _, dim = buf.shape
            new = torch.zeros(rows, heads, capacity, dim, dtype=buf.dtype, device=buf.device)
            new[:, :, :old] = buf
            return new

        self.keys = [widen(b) for b in self.keys]
        self.values = [widen(b) for b in self.values]
        mask = torch.full((self.max_rows, capacity), float("-inf"), dtype=self.mask.dtype, device=self.device)
        mask[:, :old] = self.mask
        self.mask, self.capacity = mask, capacity

    def memory_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.keys, *self.values))
