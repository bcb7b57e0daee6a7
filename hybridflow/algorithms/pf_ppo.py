"""PF-PPO: policy filtration by resampling the batch according to reward (Zhang et al. 2024, arXiv 2409.06957).

A reward model is least reliable for middling scores, so PF-PPO trains more on responses whose reward
is trustworthy.  As in verl, each row gets a weight from its sequence score
S_i = Σ_t token_level_scores[i, t] and the batch is resampled *with replacement* (same size) from the
multinomial distribution ∝ weight:

* ``pow``         w_i = |S_i|^weight_pow
* ``max_min``     w_i = 1 if S_i is the batch max or min, else 0   (the paper's BR/BW filter)
* ``max_random``  w_i = 0.4 if S_i is the batch max, else 0.1

Every weight gets +1e-8 so an all-zero batch still samples uniformly.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.protocol import DataProto

__all__ = ["PF_PPO_METHODS", "compute_pf_ppo_weights", "compute_pf_ppo_reweight_data"]

PF_PPO_METHODS = ("pow", "max_min", "max_random")


def compute_pf_ppo_weights(scores: torch.Tensor, reweight_method: str, weight_pow: float) -> torch.Tensor:
    """Unnormalised sampling weight per row (see the module docstring)."""
    if reweight_method == "pow":
        weights = scores.abs().pow(weight_pow)
    elif reweight_method == "max_min":
        extreme = (scores == scores.max()) | (scores == scores.min())
        weights = extreme.to(scores.dtype)
    elif reweight_method == "max_random":
        weights = torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    else:
        raise ValueError(
            f"Unknown algorithm.pf_ppo.reweight_method '{reweight_method}'; choose one of {', '.join(PF_PPO_METHODS)}"
        )
    return weights + 1e-8


def compute_pf_ppo_reweight_data(
    data: DataProto, reweight_method: str = "pow", weight_pow: float = 2.0, seed: int | None = None
) -> DataProto:
    """Resample ``data``'s rows by PF-PPO weights of ``token_level_scores``; same size, meta_info kept.

    ``seed`` makes the draw reproducible (the trainer passes e.g. its global step); ``None`` uses
    torch's global generator.
    """
    if "token_level_scores" not in data.batch:
        raise KeyError("PF-PPO reweighting needs 'token_level_scores' in the batch (run the reward stage first)")
    scores = data.batch["token_level_scores"].sum(dim=-1).float()
    weights = compute_pf_ppo_weights(scores, reweight_method, weight_pow)
    generator = None
    if seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(int(seed))
    picked = torch.multinomial(weights.cpu(), num_samples=len(data), replacement=True, generator=generator)
    out = data.select_idxs(picked.numpy().astype(np.int64))
    out.meta_info = dict(data.meta_info)
    return out
