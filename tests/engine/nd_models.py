"""The tiny checkpoints of the N-D engine tests: models of the library's family table (``utils/tiny_model.FAMILIES``,
the one table the library, these tests, ``tests/families`` and the vLLM family tests share) at the ``nano`` size
(64 hidden units, 2 layers, 4 query heads, 2 key/value heads: what the tp and ep splits need), with the char
tokenizer and ``initializer_range=0.2`` (larger weights than a real init, so that attention, positions and
routing change the outputs the tests compare)."""

from __future__ import annotations

ND_OVERRIDES = {"initializer_range": 0.2}


def build_model(family: str, seed: int = 0):
    """The random-init ``family`` model, in memory."""
    from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

    return build_tiny_model(build_char_tokenizer(), size="nano", family=family, seed=seed, **ND_OVERRIDES)


def write_model(path, family: str, seed: int = 0) -> str:
    """Write tokenizer + random-init ``family`` model to ``path``; returns the path.  ``family+kv4``: the family
    with 4 key/value heads (what tp 4 needs)."""
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    family, _, variant = family.partition("+")
    extra = {"num_key_value_heads": 4} if variant == "kv4" else {}
    return str(make_tiny_checkpoint(path, size="nano", family=family, seed=seed, **ND_OVERRIDES, **extra))
