"""The split model's additive checksums (``engine/shard_checksum.py``): pieces add up to the whole, and a value
missing, changed or misplaced along any dimension changes the sum."""

from __future__ import annotations

import torch

from hybridflow.engine.shard_checksum import RTOL, box_checksum, changed


def _boxes(shape, splits):
    """Nested torch.chunk boxes of a tensor of ``shape``, ``splits[d]`` pieces along dimension d."""
    out = [()]
    for n, k in zip(shape, splits):
        edges = [0]
        for part in torch.arange(n).chunk(k):
            edges.append(edges[-1] + len(part))
        out = [b + ((lo, hi),) for b in out for lo, hi in zip(edges, edges[1:])]
    return out


def _sum(t, boxes):
    return sum(box_checksum(t[tuple(slice(lo, hi) for lo, hi in b)], b, t.dim()) for b in boxes)


def test_pieces_add_up_to_the_whole():
    torch.manual_seed(0)
    t = torch.randn(12, 10)
    whole = box_checksum(t, ((0, 12), (0, 10)), 2)
    for splits in ((2, 1), (1, 2), (3, 2), (4, 5)):
        parts = _sum(t, _boxes(t.shape, splits))
        assert torch.allclose(parts, whole, rtol=RTOL, atol=0), splits
    v = torch.randn(7)
    assert torch.allclose(_sum(v, _boxes(v.shape, (3,))), box_checksum(v, ((0, 7),), 1), rtol=RTOL, atol=0)


def test_a_missing_changed_or_misplaced_value_is_seen():
    torch.manual_seed(1)
    t = torch.randn(8, 6)
    whole = box_checksum(t, ((0, 8), (0, 6)), 2)[0]
    swapped_rows = t[[1, 0, *range(2, 8)]]
    swapped_cols = t[:, [1, 0, *range(2, 6)]]
    nudged = t.clone()
    nudged[3, 4] += 1e-4
    for bad in (swapped_rows, swapped_cols, nudged, torch.zeros_like(t)):
        diff = (box_checksum(bad, ((0, 8), (0, 6)), 2)[0] - whole).abs()
        assert bool((diff > RTOL * box_checksum(t, ((0, 8), (0, 6)), 2)[1].abs()).any())


def test_changed_lists_the_tensors_whose_checksum_moved():
    a = torch.zeros(3, 2, 3)
    b = a.clone()
    b[1, 0, 0] = 1.0
    assert changed(a, None) == [0, 1, 2]
    assert changed(a, a.clone()) == []
    assert changed(b, a) == [1]


def test_reading_in_row_chunks_gives_the_same_checksum(monkeypatch):
    """The piece is read a few rows at a time (bounded float64 temporaries): the result does not depend on it."""
    from hybridflow.engine import shard_checksum

    t = torch.randn(13, 5, 3)
    box = ((4, 17), (0, 5), (2, 5))
    whole = box_checksum(t, box, 3)
    monkeypatch.setattr(shard_checksum, "_CHUNK_ELEMENTS", 7)  # two rows of 15 elements -> one row per chunk
    torch.testing.assert_close(box_checksum(t, box, 3), whole, rtol=1e-12, atol=1e-12)
    assert float(box_checksum(torch.tensor(2.5), (), 0)[0, 0]) == 2.5  # a 0-d buffer
