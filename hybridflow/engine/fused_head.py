"""The LM head fused with its log-softmax: per-token log-probs, entropy and sum(pi^2) from the hidden states and the
head's weight, a chunk of tokens at a time, so the (tokens x vocabulary) logits never exist at once.

At a real vocabulary (Qwen2.5's 151,936 tokens) the logits of a micro-batch are the largest tensor of an RL step:
8k tokens are 5 GB in fp32, and the materialised path keeps them for the backward pass, plus their log-softmax
temporaries.  Here, for each chunk of ``c`` rows of hidden states ``h`` (c x H) and the head's weight ``W`` (V x H):

    z      = (h W^T) / T                     the chunk's scaled logits, c x V, freed before the next chunk
    lse    = logsumexp_v z                   log Z
    log p_y = z_y - lse                      the label's log-prob
    H      = lse - sum_v p_v z_v             the entropy (on request)
    S      = sum_v p_v^2                     (on request, a statistic: never differentiated)

and only ``lse`` and the entropy (c floats each) are kept.  The backward pass recomputes ``z`` chunk by chunk
(:class:`_FusedLogProbs`, a ``torch.autograd.Function``):

    dL/dz_v = g_lp (1[v = y] - p_v) - g_H p_v (log p_v + H)          dL/dlogits = dL/dz / T
    dL/dh   = dL/dlogits W                   dL/dW += dL/dlogits^T h

so the price of never holding the logits is one more ``h W^T`` product per chunk in the backward pass.  The
arithmetic of a chunk is the materialised head's (``engine/forward.py``: ``logits / T``, upcast, ``logsumexp``), so
the two agree to float rounding (``tests/engine/test_fused_head.py`` checks 1e-5, forward and gradients).

With tensor parallelism the head's weight is split over the vocabulary (a ``DTensor`` sharded on dim 0): each rank
computes its range's ``z`` and the row statistics are combined by one all-reduce of a (c,) vector each (max, sum of
exponentials, the label's logit, sum p z, sum p^2), as ``engine/vocab_parallel.py`` does for materialised logits;
the backward all-reduces dL/dh over the group (what the column-parallel head's own backward does).

How it is reached: :func:`fused_outputs` runs the model's own ``forward`` (so FSDP2's hooks, vision towers,
``logits_to_keep`` and pipeline views behave as usual) with the head's slot answered by :class:`_HeadSlot`, which
-- only inside :func:`fused_outputs` of the calling thread -- computes the outputs above from the hidden states it is
handed instead of the logits.  Models whose logits are more than ``h W^T`` (soft-capping, logit scales, a biased or
adapted head) keep the materialised head (:func:`fused_head_problem` says why).

Keys (verl's): ``actor_rollout_ref.model.use_fused_kernels=true`` with ``fused_kernel_options.impl_backend=torch``
turns it on (off by default, as in verl: the materialised head and its compiled kernels, ``use_torch_compile``,
run then); ``fused_kernel_options.chunk_size`` (hybridflow's) sets the rows per chunk, by default as many rows as
keep a chunk's fp32 logits under :data:`CHUNK_BYTES` (220 rows at 151,936 tokens, every row of a micro-batch at
512).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybridflow.engine.transformers_adapter import unwrap_peft

__all__ = ["CHUNK_BYTES", "FusedHeadSettings", "configure_fused_head", "fused_head_problem", "fused_head_settings",
           "fused_outputs", "fused_token_outputs", "chunk_rows_for"]

CHUNK_BYTES = 128 << 20  # fp32 logits of one chunk (the default chunk size)
_HEAD = "lm_head"


def chunk_rows_for(vocab: int, chunk_rows: int | None = None) -> int:
    """Rows per chunk: ``chunk_rows`` when set (> 0), else as many as keep ``rows x vocab`` fp32 under
    :data:`CHUNK_BYTES` (at least 16)."""
    if chunk_rows:
        return int(chunk_rows)
    return max(16, CHUNK_BYTES // (4 * max(int(vocab), 1)))


# ---------------------------------------------------------------------------------------------- the vocabulary split
@dataclass
class _Split:
    """This rank's part of the head's weight: the local rows, the first vocabulary id they hold, the group of the
    split (None: the whole vocabulary is here)."""

    weight: torch.Tensor
    start: int = 0
    group: object = None


def _vocab_split(weight: torch.Tensor) -> _Split:
    placements = getattr(weight, "placements", None)
    if placements is None:
        return _Split(weight)
    if not any(p.is_shard() and p.dim in (0, -2) for p in placements):
        return _Split(weight.to_local())  # replicated: every rank holds the whole head
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    mesh = weight.device_mesh
    if mesh.ndim != 1:
        raise ValueError(f"the LM head's weight must be split over a 1-D (tp) mesh, got {mesh}")
    _, offset = compute_local_shape_and_global_offset(weight.shape, mesh, placements)
    return _Split(weight.to_local(), int(offset[0]), mesh.get_group())


def _all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(t, op=op, group=group)
    return t


# ---------------------------------------------------------------------------------------------- one chunk
def scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(hidden W^T) / temperature`` in float32: the materialised head's ``logits / T`` then upcast."""
    z = F.linear(hidden, weight) / temperature
    return z.float() if z.dtype != torch.float32 else z


def _logsumexp(z: torch.Tensor, group) -> torch.Tensor:
    if group is None:
        return torch.logsumexp(z, dim=-1)
    m = z.detach().max(dim=-1).values
    _all_reduce(m, group, dist.ReduceOp.MAX)
    s = _all_reduce((z - m[:, None]).exp().sum(dim=-1), group)
    return m + s.log()


def _label_logit(z: torch.Tensor, labels: torch.Tensor, split: _Split) -> torch.Tensor:
    local = labels.long() - split.start
    if split.group is None:
        return z.gather(-1, local[:, None]).squeeze(-1)
    mine = (local >= 0) & (local < z.shape[-1])
    picked = z.gather(-1, local.clamp(0, z.shape[-1] - 1)[:, None]).squeeze(-1) * mine
    return _all_reduce(picked, split.group)


def _chunk_forward(h: torch.Tensor, labels: torch.Tensor, split: _Split, temperature: float, want_entropy: bool,
                   want_spq: bool) -> tuple[torch.Tensor, ...]:
    """(log p_y, log Z, entropy or None, sum p^2 or None) of one chunk."""
    z = scaled_logits(h, split.weight, temperature)
    lse = _logsumexp(z, split.group)
    log_p = _label_logit(z, labels, split) - lse
    entropy = spq = None
    if want_entropy or want_spq:
        p = (z - lse[:, None]).exp_()  # one more (c, V) buffer, reused for both statistics
        if want_spq:
            spq = _all_reduce(p.square().sum(dim=-1), split.group)
        if want_entropy:
            entropy = lse - _all_reduce(p.mul_(z).sum(dim=-1), split.group)
    return log_p, lse, entropy, spq


class _FusedLogProbs(torch.autograd.Function):
    """(log_probs, entropy, sum_pi_squared) of every row of ``hidden`` (N, H); empty tensors for what was not
    asked.  Saves the hidden states, the labels and two floats per row; the backward recomputes each chunk's
    logits."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, split, temperature, chunk, want_entropy, entropy_grad, want_spq):
        n = hidden.shape[0]
        outs = {k: hidden.new_empty(n if want else 0, dtype=torch.float32)
                for k, want in (("lp", True), ("lse", True), ("ent", want_entropy), ("spq", want_spq))}
        for i in range(0, n, chunk):
            lp, lse, ent, spq = _chunk_forward(hidden[i:i + chunk], labels[i:i + chunk], split, temperature,
                                               want_entropy, want_spq)
            outs["lp"][i:i + chunk], outs["lse"][i:i + chunk] = lp, lse
            if ent is not None:
                outs["ent"][i:i + chunk] = ent
            if spq is not None:
                outs["spq"][i:i + chunk] = spq
        ctx.save_for_backward(hidden, weight, labels, outs["lse"], outs["ent"])
        ctx.split, ctx.temperature, ctx.chunk = split, temperature, chunk
        ctx.entropy_grad = want_entropy and entropy_grad
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(outs["ent"])
        ctx.mark_non_differentiable(outs["spq"])
        return outs["lp"], outs["ent"], outs["spq"]

    @staticmethod
    def backward(ctx, g_lp, g_ent, g_spq):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        split = ctx.split
        d_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        use_ent = ctx.entropy_grad and g_ent is not None
        for i in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            h = hidden[rows]
            dz = _chunk_grad(h, labels[rows], split, ctx.temperature, lse[rows],
                             g_lp[rows] if g_lp is not None else None,
                             (g_ent[rows], entropy[rows]) if use_ent else None)
            d_logits = dz.div_(ctx.temperature).to(weight.dtype)
            if d_hidden is not None:
                d_hidden[rows] = _all_reduce(d_logits @ weight, split.group)
            if d_weight is not None:
                d_weight.addmm_(d_logits.t().to(d_weight.dtype), h.to(d_weight.dtype))
        if d_weight is not None:
            d_weight = d_weight.to(weight.dtype)
        return d_hidden, d_weight, None, None, None, None, None, None, None


def _chunk_grad(h, labels, split: _Split, temperature: float, lse, g_lp, ent) -> torch.Tensor:
    """dL/dz of one chunk (c, V_local) from the saved log Z (and entropy), the logits recomputed; two (c, V) buffers:

        dL/dz = -p (g_lp + g_H (log p + H)) + g_lp 1[v = y]
    """
    log_p = scaled_logits(h, split.weight, temperature).sub_(lse[:, None])
    p = log_p.exp()
    g_lp = g_lp if g_lp is not None else torch.zeros_like(lse)
    if ent is not None:
        g_ent, entropy = ent
        factor = log_p.add_(entropy[:, None]).mul_(g_ent[:, None]).add_(g_lp[:, None])
    else:
        factor = g_lp[:, None]
    dz = p.mul_(factor).neg_()
    local = labels.long() - split.start
    mine = ((local >= 0) & (local < dz.shape[-1])).nonzero().flatten()
    dz[mine, local[mine]] += g_lp[mine]
    return dz


def fused_token_outputs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                        calculate_entropy: bool = False, entropy_grad: bool = True, sum_pi_squared: bool = False,
                        chunk_rows: int | None = None) -> dict[str, torch.Tensor]:
    """``{"log_probs", "entropy"?, "sum_pi_squared"?}`` of shape ``labels.shape`` for hidden states ``(..., H)`` and
    the head's weight ``(V, H)`` (a plain tensor, or a DTensor split over the vocabulary), never holding more than
    one chunk of logits.  ``entropy_grad=False``: the entropy is a metric (no gradient flows through it)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute log-probs, got {temperature}")
    if getattr(hidden, "placements", None) is not None:  # a DTensor: the head sees the whole rows
        from torch.distributed.tensor import Replicate

        hidden = hidden.redistribute(placements=[Replicate()] * hidden.device_mesh.ndim).to_local()
    shape = labels.shape
    split = _vocab_split(weight)
    flat = hidden.reshape(-1, hidden.shape[-1])
    chunk = chunk_rows_for(split.weight.shape[0], chunk_rows)
    lp, ent, spq = _FusedLogProbs.apply(flat, split.weight, labels.reshape(-1), split, float(temperature), chunk,
                                        bool(calculate_entropy), bool(entropy_grad and torch.is_grad_enabled()),
                                        bool(sum_pi_squared))
    out = {"log_probs": lp.view(shape)}
    if calculate_entropy:
        out["entropy"] = ent.view(shape) if entropy_grad else ent.detach().view(shape)
    if sum_pi_squared:
        out["sum_pi_squared"] = spq.detach().view(shape)
    return out


# ---------------------------------------------------------------------------------------------- the model's head slot
@dataclass(frozen=True)
class FusedHeadSettings:
    """Whether a model's LM head runs fused (``actor_rollout_ref.model.use_fused_kernels``) and its chunk size in
    rows (``fused_kernel_options.chunk_size``; None: by :data:`CHUNK_BYTES`)."""

    enabled: bool = False
    chunk_rows: int | None = None


_SETTINGS: "weakref.WeakKeyDictionary[nn.Module, FusedHeadSettings]" = weakref.WeakKeyDictionary()


def _causal_lm(module) -> nn.Module:
    """The Hugging Face model whose ``forward`` calls the head (through peft wrappers and pipeline views)."""
    return unwrap_peft(module)


def configure_fused_head(module, enabled: bool, chunk_rows: int | None = None) -> None:
    """Set how ``module``'s LM head computes log-probs (kept with the head module itself, so views of the model --
    pipeline stages, peft wrappers -- share the setting).  Models without a plain LM head ignore it."""
    head = _causal_lm(module)._modules.get(_HEAD)
    if chunk_rows is not None and int(chunk_rows) < 0:
        raise ValueError(f"actor_rollout_ref.model.fused_kernel_options.chunk_size must be >= 0 (0: automatic), got "
                         f"{chunk_rows}")
    if head is not None:
        _SETTINGS[head] = FusedHeadSettings(bool(enabled), int(chunk_rows) if chunk_rows else None)


def fused_head_settings(module) -> FusedHeadSettings:
    head = _causal_lm(module)._modules.get(_HEAD)
    return _SETTINGS.get(head, FusedHeadSettings()) if head is not None else FusedHeadSettings(False)


_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")  # Gemma-2/3, Cohere, Granite


def fused_head_problem(module) -> str | None:
    """Why ``module``'s logits are not ``h W^T`` of a plain head (then the head stays materialised), or None."""
    lm = _causal_lm(module)
    head = lm._modules.get(_HEAD) if isinstance(lm, nn.Module) else None
    if head is None:
        return f"{type(lm).__name__} has no {_HEAD}"
    if not isinstance(head, nn.Linear) or hasattr(head, "base_layer"):
        return f"its {_HEAD} is a {type(head).__name__} (an adapter or a quantised layer), not an nn.Linear"
    if head.bias is not None:
        return f"its {_HEAD} has a bias"
    config = getattr(lm, "config", None)
    configs = [config, getattr(config, "text_config", None)] if config is not None else []
    for c in configs:
        for name in _SCALED_LOGITS:
            value = getattr(c, name, None) if c is not None else None
            if value not in (None, 1, 1.0):
                return f"its logits are scaled after the head ({name}={value})"
    return None


@dataclass
class _Request:
    labels: torch.Tensor
    keep: int | torch.Tensor | None
    temperature: float
    calculate_entropy: bool
    entropy_grad: bool
    sum_pi_squared: bool
    chunk_rows: int | None
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)


_REQUEST: contextvars.ContextVar[_Request | None] = contextvars.ContextVar("hybridflow_fused_head", default=None)


class _HeadSlot:
    """What ``model.lm_head`` resolves to once fused heads are installed: the real head (``_modules["lm_head"]``,
    still what ``state_dict``, FSDP2 and tensor parallelism see) for every call, except inside
    :func:`fused_outputs` on the calling thread, where it computes the request's outputs from the hidden states
    and hands the model an empty ``(b, l, 0)`` tensor as its logits."""

    def __init__(self, owner: nn.Module):
        self._owner = weakref.ref(owner)

    def _head(self) -> nn.Module:
        return self._owner()._modules[_HEAD]

    def __call__(self, hidden: torch.Tensor, *args, **kwargs):
        req = _REQUEST.get()
        if req is None or req.outputs:
            return self._head()(hidden, *args, **kwargs)
        if req.keep is not None and hidden.shape[1] != req.labels.shape[1]:  # the model kept every position
            hidden = hidden[:, -req.keep:] if isinstance(req.keep, int) else hidden[:, req.keep]
        req.outputs = fused_token_outputs(hidden, self._head().weight, req.labels, req.temperature,
                                          req.calculate_entropy, req.entropy_grad, req.sum_pi_squared,
                                          req.chunk_rows)
        return hidden[..., :0]

    def __getattr__(self, name: str):
        return getattr(self._head(), name)


def _install(lm: nn.Module) -> None:
    """Answer ``lm.lm_head`` with a :class:`_HeadSlot` (an instance attribute, found before ``nn.Module``'s
    lookup of submodules; the submodule itself stays registered where it was)."""
    slot = lm.__dict__.get(_HEAD)
    if not isinstance(slot, _HeadSlot) or slot._owner() is not lm:
        lm.__dict__[_HEAD] = _HeadSlot(lm)


@contextlib.contextmanager
def _requested(req: _Request) -> Iterator[_Request]:
    token = _REQUEST.set(req)
    try:
        yield req
    finally:
        _REQUEST.reset(token)


def fused_outputs(module, run: Callable[[], object], labels: torch.Tensor, keep, temperature: float,
                  calculate_entropy: bool, entropy_grad: bool, sum_pi_squared: bool) -> dict[str, torch.Tensor] | None:
    """Run ``run()`` (the model's forward over the positions ``keep``, labels ``labels`` (b, l)) with the fused head
    and return its per-position outputs; None when ``module``'s head is not fused (disabled, or
    :func:`fused_head_problem`): the caller computes the logits then."""
    settings = fused_head_settings(module)
    if not settings.enabled or fused_head_problem(module) is not None:
        return None
    lm = _causal_lm(module)
    _install(lm)
    req = _Request(labels, keep, float(temperature), bool(calculate_entropy), bool(entropy_grad),
                   bool(sum_pi_squared), settings.chunk_rows)
    root = _fsdp_root(module)
    with _requested(req):
        run()
    if root is not None and not torch.is_grad_enabled():
        root.reshard()  # a forward-only pass: nothing will unshard-for-backward, give the memory back now
    if not req.outputs:
        raise RuntimeError(f"{type(lm).__name__}.forward never called its {_HEAD}: the fused head cannot compute "
                           "log-probs for this model; set actor_rollout_ref.model.use_fused_kernels=false")
    return req.outputs


def _fsdp_root(module) -> nn.Module | None:
    """``module`` when FSDP2 shards it as the root unit (None otherwise), set to keep its own parameters (the
    embeddings, the final norm and the LM head) unsharded from forward to backward: the fused head's outputs do not
    flow through the root's output logits, so FSDP2's pre-backward hook on those logits never runs to unshard them
    again, and the head's and the norm's backward read the weights. The final backward callback reshards them."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        return None
    if not getattr(module, "_hybridflow_fused_root", False):
        module.set_reshard_after_forward(False, recurse=False)
        module._hybridflow_fused_root = True
    return module
