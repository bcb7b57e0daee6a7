"""The head-count rule of Ulysses sequence parallelism, shared by the config check (no torch) and the engine."""

from __future__ import annotations

__all__ = ["ulysses_head_error"]


def ulysses_head_error(num_heads: int, num_kv_heads: int, sp: int, key: str) -> str | None:
    """Why ``num_heads`` query / ``num_kv_heads`` key-value heads cannot be split over ``sp`` ranks (None: they can).

    Ulysses gives each rank num_heads / sp query heads; key/value heads are split the same way, or, when there
    are fewer than sp, each is repeated sp / num_kv_heads times (verl's rule), which needs num_kv_heads | sp.
    """
    if sp <= 1:
        return None
    if num_heads % sp:
        return (f"{key}={sp}: the model has {num_heads} attention heads, which do not split over {sp} ranks "
                f"(Ulysses gives each rank num_attention_heads / sp heads); choose a divisor of {num_heads}")
    if num_kv_heads % sp and sp % num_kv_heads:
        return (f"{key}={sp}: the model has {num_kv_heads} key/value heads; Ulysses needs them to split over the "
                f"{sp} ranks or, when there are fewer, to divide {sp} (each is then repeated); choose sp dividing "
                f"{num_kv_heads} or a multiple of it that divides {num_heads}")
    return None
