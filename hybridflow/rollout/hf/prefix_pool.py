"""Parked KV rows of finished requests, looked up by token prefix (prefix reuse across agent turns).

A multi-turn agent loop sends turn k+1 of a trajectory as ``prompt = turn k's prompt + its response +
the tool observation``.  The K/V of everything but the observation was computed while turn k decoded, so
when a request finishes, its cache row stays *parked* under the token ids whose K/V it holds, and a later
request whose prompt starts with those ids takes the row over and prefills only its new suffix (vLLM's
automatic prefix caching and SGLang's RadixAttention do this per block / per radix node; here the unit is
a whole finished sequence, which is what agent turns reuse).

The pool only keeps the bookkeeping -- which cache row holds which tokens, and least-recently-used order;
the batcher owns the rows and moves them.  Lookup hashes every prefix of the prompt once (a polynomial
rolling hash) and probes the lengths that parked sequences have, longest first, so its cost is
O(len(prompt) + distinct parked lengths), not O(parked x length).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

__all__ = ["ParkedSequence", "PrefixPool"]

_MOD = (1 << 61) - 1
_BASE = 1_000_003


def _prefix_hashes(tokens: list[int] | tuple[int, ...], upto: int) -> list[int]:
    """``h[L]`` = hash of ``tokens[:L]`` for L in 0..upto."""
    out = [0] * (upto + 1)
    h = 0
    for i in range(upto):
        h = (h * _BASE + tokens[i] + 1) % _MOD
        out[i + 1] = h
    return out


@dataclass(eq=False)
class ParkedSequence:
    """A cache row holding the K/V of ``tokens`` (columns ``[0, len(tokens))``)."""

    tokens: tuple[int, ...]
    row: int
    key: tuple[int, int]  # (length, hash)
    last_used: int = 0
    pinned: bool = field(default=False)


class PrefixPool:
    """Parked sequences by row and by (length, prefix hash), in least-recently-used order."""

    def __init__(self):
        self._by_key: dict[tuple[int, int], ParkedSequence] = {}
        self._lengths: dict[int, int] = {}  # length -> how many parked sequences have it
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_key)

    def entries(self) -> list[ParkedSequence]:
        return list(self._by_key.values())

    def rows(self) -> set[int]:
        return {e.row for e in self._by_key.values()}

    def park(self, tokens: tuple[int, ...], row: int) -> ParkedSequence:
        """Record that ``row`` holds the K/V of ``tokens``; a sequence parked with the same tokens is
        replaced (and returned by :meth:`park` callers' bookkeeping through ``row`` being reused)."""
        key = (len(tokens), _prefix_hashes(tokens, len(tokens))[-1])
        old = self._by_key.get(key)
        if old is not None:
            self.remove(old)
        entry = ParkedSequence(tokens, row, key, next(self._clock))
        self._by_key[key] = entry
        self._lengths[key[0]] = self._lengths.get(key[0], 0) + 1
        return entry

    def remove(self, entry: ParkedSequence) -> None:
        if self._by_key.get(entry.key) is not entry:
            return
        del self._by_key[entry.key]
        left = self._lengths[entry.key[0]] - 1
        if left:
            self._lengths[entry.key[0]] = left
        else:
            del self._lengths[entry.key[0]]

    def lookup(self, prompt: list[int]) -> tuple[ParkedSequence | None, int]:
        """The parked sequence sharing the longest prefix with ``prompt`` among those that are a prefix of
        it, and how many of its columns can be reused: at most ``len(prompt) - 1``, because the last
        prompt token must run through the model to give the next token's logits."""
        n = len(prompt)
        candidates = sorted((length for length in self._lengths if length <= n), reverse=True)
        if not candidates:
            return None, 0
        hashes = _prefix_hashes(prompt, candidates[0])
        for length in candidates:
            entry = self._by_key.get((length, hashes[length]))
            if entry is not None and entry.tokens == tuple(prompt[:length]):
                entry.last_used = next(self._clock)
                return entry, min(length, n - 1)
        return None, 0

    def lru(self) -> list[ParkedSequence]:
        """Unpinned entries (not being taken over), least recently used first: the eviction order."""
        return sorted((e for e in self._by_key.values() if not e.pinned), key=lambda e: e.last_used)

    def clear(self) -> int:
        n = len(self._by_key)
        self._by_key.clear()
        self._lengths.clear()
        return n
