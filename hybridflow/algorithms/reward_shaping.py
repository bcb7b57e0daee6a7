"""Reward shaping helpers that are pure functions of response statistics."""

from __future__ import annotations

import torch

__all__ = ["compute_overlong_penalty"]


def compute_overlong_penalty(
    response_lengths: torch.Tensor, max_resp_len: int, overlong_buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13).

    With the expected length L_exp = max_resp_len − overlong_buffer_len:

        penalty(|y|) = min(−(|y| − L_exp) / overlong_buffer_len · penalty_factor, 0)

    i.e. 0 up to L_exp, falling linearly to −penalty_factor at max_resp_len (the paper's R_length with
    factor 1; lengths beyond max_resp_len keep falling, as in verl, since a truncated response has
    exactly max_resp_len tokens).  Returns a float tensor shaped like ``response_lengths`` to add to
    the sequence score.
    """
    if overlong_buffer_len <= 0:
        raise ValueError(f"overlong_buffer_cfg.len must be > 0, got {overlong_buffer_len}")
    if overlong_buffer_len > max_resp_len:
        raise ValueError(
            f"overlong_buffer_cfg.len ({overlong_buffer_len}) must not exceed max_resp_len ({max_resp_len})"
        )
    expected = max_resp_len - overlong_buffer_len
    lengths = torch.as_tensor(response_lengths, dtype=torch.float32)
    return (-(lengths - expected) / overlong_buffer_len * penalty_factor).clamp(max=0.0)
