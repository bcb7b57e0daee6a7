"""Loss aggregation (verl's ``agg_loss``) with split-invariant global normalisers.

The problem this solves: a PPO mini-batch is cut into micro-batches (gradient accumulation) and
spread over data-parallel ranks.  If every micro-batch divided by its *own* token count, a short
micro-batch's tokens would weigh more than a long one's and the update would depend on how the
batch happened to be split.  Instead the engine counts the normalisers over the whole mini-batch,
once, and every micro-batch divides by those global counts.

Convention (what the engine must do)
------------------------------------
1. For the mini-batch, call :func:`count_loss_normalizers` on each micro-batch's ``response_mask``,
   sum the counts over the micro-batches of the rank and all-reduce (SUM) them over DP ranks.
2. Compute each micro-batch's loss with those counts
   (``agg_loss(..., global_token_num=T, global_batch_size=N, loss_scale_factor=L, dp_size=D)``),
   call ``backward`` on it and let the gradients *accumulate* (no ``1/num_micro_batches`` factor).
3. ``dp_size`` compensates a gradient reduction that *averages* over ranks (FSDP/DDP do): the
   micro-batch loss is multiplied by ``D`` so that the rank-average of the accumulated gradients is
   the gradient of the whole-batch loss.  An engine whose reduction *sums* passes ``dp_size=1``.

With ``dp_size=1`` the sum of the per-micro-batch losses over all micro-batches and ranks equals the
loss of the whole batch computed in one piece, for every mode, however the batch is split.

Modes, with m the mask, L the per-token loss, T the token count, N the count of non-empty sequences:

* ``token-mean``               Σ_i Σ_t L·m / T                          (DAPO 2503.14476, token-level)
* ``token-sum``                Σ_i Σ_t L·m                              (no normaliser: the gradient grows with
                                                                         the number of tokens; verl's ``token-sum``)
* ``seq-mean-token-sum``       Σ_i (Σ_t L·m) / N
* ``seq-mean-token-mean``      Σ_i (Σ_t L·m / Σ_t m) / N                (GRPO 2402.03300, eq. 3)
* ``seq-mean-token-sum-norm``  Σ_i (Σ_t L·m) / (N · loss_scale_factor)  (Dr.GRPO 2503.20783: 1/(G·L))

``loss_scale_factor`` defaults to the padded response length of the tensor it is given, which differs
between micro-batches that were padded differently: an engine that wants split invariance for
``seq-mean-token-sum-norm`` passes a constant (e.g. ``data.max_response_length``).
"""

from __future__ import annotations

import torch

from .masked import masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "count_loss_normalizers", "check_loss_agg_mode"]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def check_loss_agg_mode(loss_agg_mode: str) -> str:
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(
            f"Invalid loss_agg_mode '{loss_agg_mode}': set actor.loss_agg_mode (or critic.loss_agg_mode) "
            f"to one of {', '.join(LOSS_AGG_MODES)}"
        )
    return loss_agg_mode


def count_loss_normalizers(loss_mask: torch.Tensor) -> dict[str, int]:
    """Local counts to sum over micro-batches and all-reduce into the global normalisers.

    Returns ``{"global_token_num": Σ m, "global_batch_size": #rows with at least one valid token}``;
    rows with no valid token (padding rows added to fill a micro-batch) do not count as sequences.
    """
    tokens_per_row = loss_mask.to(torch.float32).sum(dim=-1)
    return {
        "global_token_num": int(tokens_per_row.sum().item()),
        "global_batch_size": int((tokens_per_row > 0).sum().item()),
    }


def _positive(value, name: str):
    if isinstance(value, torch.Tensor):
        return value.to(torch.float32).clamp(min=1.0)
    if value < 0:
        raise ValueError(f"agg_loss: {name} must be >= 0, got {value}")
    return max(float(value), 1.0)


def _require_global(dp_size: int, count, name: str) -> None:
    if dp_size > 1 and count is None:
        raise ValueError(
            f"agg_loss: dp_size={dp_size} needs {name} summed over all micro-batches and all-reduced over "
            "the DP ranks (see count_loss_normalizers); a local count would weigh ranks unequally"
        )


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_batch_size: int | torch.Tensor | None = None,
    global_token_num: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
    dp_size: int = 1,
) -> torch.Tensor:
    """Aggregate a ``(B, R)`` per-token loss into a scalar (see the module docstring for the maths).

    Without global counts the local counts of ``loss_mask`` are used (the loss of this tensor alone).
    A count of 0 (nothing to train on) gives a loss of 0 that still carries the autograd graph.
    """
    check_loss_agg_mode(loss_agg_mode)
    if dp_size < 1:
        raise ValueError(f"agg_loss: dp_size must be >= 1, got {dp_size}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(f"agg_loss: loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ")
    mask = loss_mask.to(loss_mat.dtype)

    if loss_agg_mode == "token-mean":
        _require_global(dp_size, global_token_num, "global_token_num")
        tokens = mask.sum() if global_token_num is None else global_token_num
        return masked_sum(loss_mat, loss_mask) / _positive(tokens, "global_token_num") * dp_size
    if loss_agg_mode == "token-sum":
        # No count to share: each rank's masked sum x dp_size, averaged by the gradient reduction, is the sum
        # over every valid token of the mini-batch.
        return masked_sum(loss_mat, loss_mask) * dp_size

    _require_global(dp_size, global_batch_size, "global_batch_size")
    tokens_per_row = mask.sum(dim=-1)
    seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_losses / tokens_per_row.clamp(min=1.0)
    n_seq = (tokens_per_row > 0).sum() if global_batch_size is None else global_batch_size
    loss = seq_losses.sum() / _positive(n_seq, "global_batch_size") * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if scale <= 0:
            raise ValueError(f"agg_loss: loss_scale_factor must be > 0, got {scale}")
        loss = loss / scale
    return loss
