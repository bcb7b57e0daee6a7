"""A slot KV cache that HF attention layers write into in place, sized by what is in flight.

Why not ``DynamicCache``: it concatenates every step (copying the whole cache per layer per token) and
makes all rows share one length, so finished rows cannot leave and new requests cannot join.  Here each
layer owns ``(rows, kv_heads, capacity, head_dim)`` buffers; a sequence occupies one row from column 0
(column = position: no padding inside a row), row ``b`` writes its next token at its own column
``write_cols[b]``, and an additive mask row (0 = attend, -inf = not yet written) says which columns it may
read.  Decode attention reads only the first ``kv_len`` columns of the first ``n`` rows (a view, no copy).

Three kinds of forward write into it:

* ``prefill`` -- fresh sequences: the forward's (left-padded) tokens are the whole sequence, so attention
  runs over the forward's own K/V and the cache only stores them;
* ``extend`` -- sequences that already have cached columns (a reused prefix, or the earlier chunks of a
  chunked prefill): several new tokens per row at per-row columns, attention over the row's cache;
* ``decode`` -- one token per row.

The buffers are allocated for the rows and columns asked for (:meth:`resized` reallocates, moving rows),
in the storage ``dtype`` (the rollout's compute dtype, e.g. bf16 under autocast over fp32 weights).
HF attention modules only call ``cache.update(k, v, layer_idx, ...)``, so this duck-typed object
works for every decoder in transformers that uses the standard attention interface (Llama, Qwen2,
Mistral, Gemma-2, Qwen3-MoE, DeepSeek-V3's MLA...).  Layer buffers are allocated from the first forward's key
and value shapes, each on its own (MLA caches keys wider than values), so no architecture knowledge is
needed; :class:`KVGeometry` estimates the bytes per token from the model config for sizing.  Sliding-window
layers keep every column (the window is in the masks, :mod:`~hybridflow.rollout.hf.attention_masks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVGeometry", "SlotKVCache", "cache_columns", "plan_row_moves"]

_WIDE = 64  # past this many columns a cache grows in multiples of it


def cache_columns(x: int) -> int:
    """KV-cache width for sequences of up to ``x`` tokens: a power of two from 16 to 64, then a multiple of 64.
    Short sequences get a narrow cache: the cache is zero-filled at allocation (and reallocated after every
    ``sleep`` that frees it), which for 128 rows of 12 tokens in 64 columns cost more than the decode steps'
    attention; growth past 64 columns stays rare."""
    if x <= _WIDE:
        return max(16, 1 << (max(x, 1) - 1).bit_length())
    return -(-x // _WIDE) * _WIDE


@dataclass(frozen=True)
class KVGeometry:
    """What one cached token costs: ``layers x kv_heads x (head_dim + v_head_dim) x bytes``.

    ``v_head_dim`` is ``head_dim`` except for MLA attention (DeepSeek-V2/V3), whose cached keys are
    ``qk_nope_head_dim + qk_rope_head_dim`` wide and values ``v_head_dim`` wide, one of each per query head
    (transformers expands the compressed K/V before caching them).
    """

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    v_head_dim: int | None = None

    @property
    def bytes_per_token(self) -> int:
        width = self.head_dim + (self.v_head_dim if self.v_head_dim is not None else self.head_dim)
        return self.layers * self.kv_heads * width * torch.empty((), dtype=self.dtype).element_size()

    @classmethod
    def from_config(cls, config, dtype: torch.dtype) -> "KVGeometry | None":
        """From an HF config (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``; MLA's
        ``qk_nope_head_dim`` / ``qk_rope_head_dim`` / ``v_head_dim``); None when the config does not say."""
        try:
            layers = int(config.num_hidden_layers)
            heads = int(config.num_attention_heads)
            kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
            head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
            v_dim = None
            if getattr(config, "qk_nope_head_dim", None) is not None and getattr(config, "v_head_dim", None):
                head_dim = int(config.qk_nope_head_dim) + int(config.qk_rope_head_dim)
                v_dim = int(config.v_head_dim)
        except (AttributeError, TypeError):
            return None
        return cls(layers, kv_heads, head_dim, dtype, v_dim)


class SlotKVCache:
    """Per-layer K/V buffers plus the per-row attention mask, with per-row write columns."""

    def __init__(self, rows: int, capacity: int, dtype: torch.dtype, mask_dtype: torch.dtype,
                 device: torch.device):
        if rows < 1 or capacity < 1:
            raise ValueError(f"SlotKVCache needs rows >= 1 and capacity >= 1, got {rows}, {capacity}")
        self.max_rows = rows
        self.capacity = capacity
        self.dtype = dtype
        self.device = device
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        # Additive attention mask per row and column; -inf until a column holds a real token.
        self.mask = torch.full((rows, capacity), float("-inf"), dtype=mask_dtype, device=device)
        self.n_rows = 0
        self.kv_len = 0
        self._mode = "idle"
        self._write: tuple[torch.Tensor, ...] | None = None
        self._read_rows: torch.Tensor | None = None
        self._write_cols: torch.Tensor | None = None
        self._row_index = torch.arange(rows, device=device)

    # ------------------------------------------------------------------ called by HF attention
    def update(self, key_states, value_states, layer_idx: int, *_: object, **__: object):
        """Store this step's K/V of layer ``layer_idx`` and return the K/V the layer attends over (the extra
        arguments transformers passes -- ``cache_kwargs`` or ``kwargs=`` depending on the release -- carry
        nothing this cache needs; see :mod:`hybridflow.engine.transformers_adapter`)."""
        if layer_idx == len(self.keys):  # first forward: allocate from the real shapes
            self._allocate_layer(key_states, value_states)
        k_buf, v_buf = self.keys[layer_idx], self.values[layer_idx]
        if key_states.dtype != self.dtype:  # computed in fp32 around autocast (RoPE): stored in the cache's dtype
            key_states, value_states = key_states.to(self.dtype), value_states.to(self.dtype)
        if self._mode == "decode":
            n = self.n_rows
            rows = self._row_index[:n]
            k_buf[rows, :, self._write_cols] = key_states[:, :, 0]
            v_buf[rows, :, self._write_cols] = value_states[:, :, 0]
            return k_buf[:n, :, : self.kv_len], v_buf[:n, :, : self.kv_len]
        if self._mode not in ("prefill", "extend"):
            raise RuntimeError("SlotKVCache.update called outside begin_extend()/begin_decode()")
        src_row, src_tok, dst_row, dst_col = self._write
        k_buf[dst_row, :, dst_col] = key_states[src_row, :, src_tok]
        v_buf[dst_row, :, dst_col] = value_states[src_row, :, src_tok]
        if self._mode == "prefill":  # the forward's tokens are the whole sequences: attend over them
            return key_states, value_states
        rows = self._read_rows
        return k_buf[rows, :, : self.kv_len], v_buf[rows, :, : self.kv_len]

    def _allocate_layer(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, kv_heads, _, k_dim = key_states.shape
        v_dim = value_states.shape[-1]
        shape = (self.max_rows, kv_heads, self.capacity)
        self.keys.append(torch.zeros(*shape, k_dim, dtype=self.dtype, device=self.device))
        self.values.append(torch.zeros(*shape, v_dim, dtype=self.dtype, device=self.device))

    # ------------------------------------------------------------------ called by the batcher
    def begin_extend(self, writes: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                     read_rows: torch.Tensor | None, kv_len: int) -> None:
        """Next forward writes token ``src_tok[i]`` of forward row ``src_row[i]`` into cache row ``dst_row[i]``
        at column ``dst_col[i]`` (``writes`` is that 4-tuple of (N,) tensors; a forward row may feed several
        cache rows: identical prompts share one prefill).  With ``read_rows`` (one cache row per forward
        row) attention runs over those rows' first ``kv_len`` columns (extend); without, over the forward's
        own K/V (prefill of fresh sequences)."""
        if kv_len > self.capacity:
            raise ValueError(f"a forward over {kv_len} columns exceeds the cache ({self.capacity} columns)")
        self._mode = "prefill" if read_rows is None else "extend"
        self._write, self._read_rows, self.kv_len = writes, read_rows, kv_len

    def begin_decode(self, write_cols: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Next forward writes one token per row at ``write_cols``; returns the (B, 1, 1, kv_len) mask."""
        n = write_cols.shape[0]
        self._mode, self.n_rows, self._write_cols, self.kv_len = "decode", n, write_cols, kv_len
        self.mask[self._row_index[:n], write_cols] = 0.0
        return self.mask[:n, None, None, :kv_len]

    def end(self) -> None:
        self._mode, self._write_cols, self._write, self._read_rows = "idle", None, None, None

    def set_valid_prefix(self, rows: torch.Tensor, lengths: torch.Tensor) -> None:
        """Rows ``rows`` hold real tokens in columns ``[0, lengths[i])`` and nothing after."""
        cols = torch.arange(self.capacity, device=self.device)
        valid = cols[None, :] < lengths[:, None]
        self.mask[rows] = torch.where(valid, 0.0, float("-inf")).to(self.mask.dtype)

    def move_rows(self, src: torch.Tensor, dst: torch.Tensor, cols: int) -> None:
        """Row ``dst[i]`` takes the first ``cols`` columns of row ``src[i]`` (and its mask row).  All sources
        are read before anything is written, so moves may overlap (a destination may be another source)."""
        if src.numel() == 0:
            return
        cols = min(cols, self.capacity)
        for buf in (*self.keys, *self.values):
            buf[dst, :, :cols] = buf[src, :, :cols]
        self.mask[dst] = self.mask[src]

    def resized(self, rows: int, capacity: int, src: torch.Tensor, dst: torch.Tensor, cols: int) -> "SlotKVCache":
        """A new cache of ``rows x capacity`` holding row ``src[i]`` of this one at row ``dst[i]`` (first
        ``cols`` columns); this one's buffers can be dropped afterwards."""
        new = SlotKVCache(rows, capacity, self.dtype, self.mask.dtype, self.device)
        cols = min(cols, self.capacity, capacity)
        for old_bufs, new_bufs in ((self.keys, new.keys), (self.values, new.values)):
            for buf in old_bufs:
                _, heads, _, dim = buf.shape
                fresh = torch.zeros(rows, heads, capacity, dim, dtype=buf.dtype, device=buf.device)
                if src.numel():
                    fresh[dst, :, :cols] = buf[src, :, :cols]
                new_bufs.append(fresh)
        if src.numel():
            width = min(self.capacity, capacity)
            new.mask[dst, :width] = self.mask[src, :width]
        return new

    def bytes_per_token(self) -> int | None:
        """Bytes one cached token takes over all layers (None before the first forward)."""
        if not self.keys:
            return None
        return sum(b.shape[1] * b.shape[3] * b.element_size() for b in (*self.keys, *self.values))

    def memory_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in (*self.keys, *self.values))


def plan_row_moves(live: list[int], takeovers: list[tuple[int, list[int]]], parked: list[int], n_decode: int,
                   cur_rows: int, realloc: bool) -> tuple[list[tuple[int, int]], list[int]]:
    """Where each row of a cache goes when it is compacted or reallocated: ``(moves, parked targets)``.

    The ``live`` decode rows come first, in order; each row of ``takeovers`` (a parked row, the offsets among
    the ``n_decode - len(live)`` new rows it becomes) is copied to those rows; the ``parked`` rows go after the
    decode region -- right after it on a reallocation (``realloc``: every row is copied anyway), else only the
    ones inside it move, to rows below ``cur_rows`` nobody keeps.  ``moves`` lists (source, destination) rows,
    leaving out rows that stay where they are when nothing is reallocated.
    """
    k = len(live)
    moves = [(s, d) for d, s in enumerate(live) if realloc or s != d]
    moves += [(row, k + i) for row, members in takeovers for i in members]
    if realloc:
        targets = list(range(n_decode, n_decode + len(parked)))
    else:
        staying = {r for r in parked if r >= n_decode}
        free = (r for r in range(n_decode, cur_rows) if r not in staying)
        targets = [r if r >= n_decode else next(free) for r in parked]
    moves += [(r, t) for r, t in zip(parked, targets) if realloc or r != t]
    return moves, targets
