"""Log-probs, entropy and sum(pi^2) from vocabulary-sharded logits, without gathering them.

With tensor parallelism the LM head is split over the vocabulary: rank t holds the logits z[:, V_t] of its
vocabulary range V_t (a ``DTensor`` sharded on its last dimension).  Gathering them would materialise the full
(tokens x vocabulary) tensor on every rank -- the largest activation of an RL forward at 150k vocabularies.
Instead every quantity is a sum or a max over the vocabulary, so each rank reduces its own range and one
all-reduce of a (tokens,) vector combines the ranks (Megatron's vocab-parallel cross-entropy):

    m      = max_v z_v                      (all-reduce MAX; only for stability, no gradient flows through it)
    S      = sum_v exp(z_v - m)             (all-reduce SUM)        log Z = m + log S
    z_y    = the label's logit              (all-reduce SUM: only the rank owning y contributes)
    log p_y = z_y - log Z
    H      = log Z - sum_v p_v z_v          (all-reduce SUM of each rank's sum_v p_v z_v)

The backward needs no collective: d log p_y / d z_v = 1[v = y] - p_v and dH / d z_v = -p_v (log p_v + H) are
computed on each rank's own range from the saved local log-probabilities; the gradient of the hidden state that
fed the head is then summed over the group by the head's own (column-wise) backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["is_vocab_sharded", "vocab_parallel_logprob_entropy", "vocab_parallel_sum_pi_squared"]

_CHUNK_ROWS = 2048


def is_vocab_sharded(logits) -> bool:
    """Whether ``logits`` is a DTensor sharded on its last (vocabulary) dimension."""
    placements = getattr(logits, "placements", None)
    if placements is None:
        return False
    last = logits.dim() - 1
    return any(p.is_shard() and p.dim in (last, -1) for p in placements)


def _local_shard(logits):
    """(local logits, first vocabulary id of this rank's range, the process group of the split)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = logits.device_mesh
    if mesh.ndim != 1:
        raise ValueError(f"vocabulary-sharded logits must live on a 1-D (tp) mesh, got {mesh}")
    _, offset = compute_local_shape_and_global_offset(logits.shape, mesh, logits.placements)
    return logits.to_local(), int(offset[-1]), mesh.get_group()


class _VocabParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z_local, labels, vocab_start, group, want_entropy):
        z = z_local.float()
        m = z.detach().max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        shifted = z - m.unsqueeze(-1)
        sum_exp = shifted.exp().sum(dim=-1)
        dist.all_reduce(sum_exp, op=dist.ReduceOp.SUM, group=group)
        log_s = sum_exp.log()
        local = labels.long() - vocab_start
        mine = (local >= 0) & (local < z.shape[-1])
        picked = shifted.gather(-1, local.clamp(0, z.shape[-1] - 1).unsqueeze(-1)).squeeze(-1) * mine
        dist.all_reduce(picked, op=dist.ReduceOp.SUM, group=group)
        log_p = shifted - log_s.unsqueeze(-1)  # (N, V_t) local log-probabilities
        logp_y = picked - log_s
        entropy = None
        if want_entropy:
            p_z = (log_p.exp() * shifted).sum(dim=-1)
            dist.all_reduce(p_z, op=dist.ReduceOp.SUM, group=group)
            entropy = log_s - p_z  # log Z - sum p z with z shifted by m on both sides
        ctx.save_for_backward(log_p, local, mine, entropy if entropy is not None else log_s.new_empty(0))
        ctx.input_dtype = z_local.dtype
        ctx.want_entropy = want_entropy
        return (logp_y, entropy) if want_entropy else (logp_y, log_s.new_zeros(0))

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        log_p, local, mine, entropy = ctx.saved_tensors
        p = log_p.exp()
        grad = -p * g_logp.unsqueeze(-1)
        rows = mine.nonzero().flatten()
        grad[rows, local[rows]] += g_logp[rows]
        if ctx.want_entropy and g_entropy is not None and g_entropy.numel():
            grad = grad - p * (log_p + entropy.unsqueeze(-1)) * g_entropy.unsqueeze(-1)
        return grad.to(ctx.input_dtype), None, None, None, None


def vocab_parallel_logprob_entropy(logits, labels: torch.Tensor, calculate_entropy: bool, entropy_grad: bool = True,
                                   chunk: int = _CHUNK_ROWS):
    """Log-probs of ``labels`` (N,) and, on request, entropies, for (N, V) logits sharded over the vocabulary.

    ``entropy_grad=False`` computes the entropy outside autograd (a metric).  Rows are processed ``chunk`` at a
    time, so the float32 temporaries are at most ``chunk x V/tp``.
    """
    z_local, start, group = _local_shard(logits)
    log_probs, entropies = [], []
    for i in range(0, z_local.shape[0], chunk):
        z, y = z_local[i:i + chunk], labels[i:i + chunk]
        if calculate_entropy and not (entropy_grad and torch.is_grad_enabled()):
            lp, _ = _VocabParallel.apply(z, y, start, group, False)
            with torch.no_grad():
                _, ent = _VocabParallel.apply(z.detach(), y, start, group, True)
        else:
            lp, ent = _VocabParallel.apply(z, y, start, group, calculate_entropy)
        log_probs.append(lp)
        if calculate_entropy:
            entropies.append(ent)
    empty = z_local.new_zeros(0, dtype=torch.float32)
    log_probs = torch.cat(log_probs) if log_probs else empty
    entropy = (torch.cat(entropies) if entropies else empty) if calculate_entropy else None
    return log_probs, entropy


def vocab_parallel_sum_pi_squared(logits, chunk: int = _CHUNK_ROWS) -> torch.Tensor:
    """sum_v pi(v)^2 per row of vocabulary-sharded (N, V) logits, outside autograd."""
    z_local, _, group = _local_shard(logits)
    out = []
    with torch.no_grad():
        for i in range(0, z_local.shape[0], chunk):
            z = z_local[i:i + chunk].float()
            m = z.max(dim=-1).values
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
            shifted = z - m.unsqueeze(-1)
            s = shifted.exp().sum(dim=-1)
            dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
            sq = (2 * (shifted - s.log().unsqueeze(-1))).exp().sum(dim=-1)
            dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=group)
            out.append(sq)
    return torch.cat(out) if out else z_local.new_zeros(0, dtype=torch.float32)
