"""Masked reductions over (batch, response) tensors.

Every RL quantity lives on a padded ``(B, R)`` grid where ``response_mask`` marks the tokens that
count.  Padding may hold anything (garbage log-probs, ``inf`` from a masked softmax), so these
helpers select with ``torch.where`` instead of multiplying by the mask: ``0 * inf`` is ``nan`` and
would leak padding into the result.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_mean", "masked_var", "masked_whiten"]


def _select(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values over positions where ``mask`` is non-zero (all dims, or along ``axis``)."""
    selected = _select(values, mask)
    return selected.sum() if axis is None else selected.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ_{m=1} values / Σ m; an all-masked reduction returns 0 rather than ``nan``."""
    count = mask.to(values.dtype)
    count = count.sum() if axis is None else count.sum(dim=axis)
    return masked_sum(values, mask, axis) / count.clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over the masked positions; ``unbiased`` applies Bessel's n/(n−1) as verl does.

    Raises when the mask selects no element, or a single one with ``unbiased`` (n−1 = 0), because a
    silent ``inf``/``nan`` here would whiten every advantage of the batch into garbage.
    """
    n = mask.to(values.dtype).sum()
    if n == 0:
        raise ValueError("masked_var: the mask selects no element; the batch has no response token to whiten")
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        if n == 1:
            raise ValueError(
                "masked_var: the mask selects a single element, so the unbiased variance divides by zero; "
                "use a batch with at least two response tokens"
            )
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean) / sqrt(var + 1e-8) with masked mean and unbiased masked variance.

    ``shift_mean=False`` adds the mean back (rescale only).  Masked positions are returned as they
    are computed (callers multiply by the mask where they need zeros there).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
