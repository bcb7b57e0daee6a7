"""Expert parallelism for MoE layers: experts split over the ``ep`` ranks, tokens sent to them with all-to-all.

A MoE layer (Qwen3-MoE, DeepSeek-V3) routes every token to its top-k of E experts.  With ``ep`` ranks in an
expert-parallel group, rank r holds experts [r E/ep, (r+1) E/ep) of every MoE layer (their weights are a
``DTensor`` sharded on the expert dimension) and the ranks hold *different* tokens (ep is a sub-dimension of data
parallelism).  The router runs where the tokens are, unchanged -- transformers' own router module computes the
top-k experts and their weights, so routing (softmax or sigmoid scores, group-limited selection, top-k
normalisation, scaling) is exactly the model's -- and only the experts module's forward is replaced:

1. every (token, chosen expert) pair is sorted by expert, so the pairs for each destination rank are contiguous;
2. the counts are exchanged (all-to-all of ``ep`` integers), then the token rows (all-to-all with uneven splits)
   and their local expert ids;
3. each rank runs its experts on the rows it received, grouped by expert;
4. the outputs travel back the same way (the inverse all-to-all), are scaled by the routing weights and summed
   per token.

The models' own implementations are dropless (no capacity factor: every token reaches all k of its experts), and
so is this one: the all-to-all splits are as uneven as the routing.  The all-to-alls are differentiable (the
backward sends gradients along the reverse route), so a token's gradient comes back to the rank that holds it,
and an expert's gradient sums the contributions of every rank's tokens.

Expert groups over dp x sp x tp (``ParallelDims.ep_beyond_dp``, Megatron's layout for ep wider than dp): the tp
ranks of a group hold the same tokens, so before step 1 each keeps its 1/tp slice of them (and of their routing) and after
step 4 the outputs are all-gathered over tp.  Backward mirrors it: the slice gathers its rows' gradients from the
tp group, the gather keeps the rank's rows (the gradient of a replicated activation is the same on every tp rank).

Gradient scale: each expert's gradient already sums over the ep group's tokens, then FSDP2 reduces it over the
``efsdp`` ranks (edp x sp x tp) that hold the same experts, while the dense parameters average over the
dp x sp ranks.  The experts' FSDP units therefore divide by efsdp x ep (:func:`expert_gradient_divide_factor`),
which makes both the same average over the data; when the groups span tp no token is counted tp times, and the
factor is efsdp x ep / tp (= dp).
"""

from __future__ import annotations

import types

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybridflow.engine.tensor_parallel import SumGradient
from hybridflow.engine.transformers_adapter import ExpertsLayout, moe_experts

__all__ = ["ExpertParallelError", "apply_expert_parallel", "expert_forward", "expert_gradient_divide_factor",
           "expert_parallel_problem", "EP_TRAFFIC"]


class ExpertParallelError(ValueError):
    """A model / ep combination that cannot be split (the message says why and what to change)."""


class _Traffic:
    """Bytes of token rows this process sent in expert all-to-alls (forward and backward)."""

    def __init__(self) -> None:
        self.bytes = 0.0

    def reset(self) -> None:
        self.bytes = 0.0


EP_TRAFFIC = _Traffic()


def expert_parallel_problem(num_experts: int | None, ep: int, key: str) -> str | None:
    if ep <= 1:
        return None
    if not num_experts:
        return f"{key}={ep} splits the experts of MoE layers, but the model has none (a dense model): set it to 1"
    if num_experts % ep:
        return f"{key}={ep} must divide the {num_experts} experts of each MoE layer"
    return None


def expert_gradient_divide_factor(expert_fsdp_size: int, ep: int, tp_in_ep: int = 1) -> int:
    """efsdp x ep, over ``tp_in_ep`` when the expert groups span tp (its ranks then send each token once, not once
    per tp rank, so the experts' gradients hold no tp copies to average away)."""
    return int(expert_fsdp_size) * int(ep) // int(tp_in_ep)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits whose backward is the reverse all-to-all."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _exchange(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _exchange(grad, in_splits, out_splits, ctx.group), None, None, None


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    if x.is_floating_point():
        EP_TRAFFIC.bytes += float(x.numel() * x.element_size())
    return out


def _local_weights(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's experts' ``gate_up_proj`` and ``down_proj``, with the active LoRA adapters folded in (each
    ``scaling x lhs_e @ rhs_e`` of the local experts e only; see :func:`_lora_experts_forward`)."""
    gu, down = module.gate_up_proj, module.down_proj
    if hasattr(gu, "to_local"):
        gu, down = gu.to_local(), down.to_local()
    spec = module._hybridflow_ep
    adapters = spec.get("lora")
    if not adapters:
        return gu, down
    weights = {"gate_up_proj": gu, "down_proj": down}
    split = spec.get("tp_split")
    for name, lhs, rhs, scaling in adapters:
        if split is not None:  # the tp ranks saw different tokens: each factor's gradient sums over them
            lhs, rhs = SumGradient.apply(lhs, split[0]), SumGradient.apply(rhs, split[0])
        weights[name] = torch.baddbmm(weights[name], _local_experts(lhs, spec), _local_experts(rhs, spec),
                                      alpha=scaling)
    return weights["gate_up_proj"], weights["down_proj"]


def _local_experts(stack: torch.Tensor, spec: dict) -> torch.Tensor:
    """The rows of an (experts, ...) stack that belong to this rank's experts."""
    return stack[spec["index"] * spec["local"]:(spec["index"] + 1) * spec["local"]]


def _lora_experts_forward(self, x: torch.Tensor, *args, **kwargs):
    """The forward of a peft ``ParamWrapper`` (LoRA on a 3-D expert parameter) around an expert-parallel experts
    module, installed by :func:`apply_expert_parallel`.

    peft folds ``W + scaling x lhs @ rhs`` with one ``baddbmm`` over the whole expert stack through a
    parametrization of the parameter; split over ep, the parameter is a DTensor holding this rank's experts and the
    factors are plain tensors of every expert, which cannot mix.  Instead the wrapper hands its active adapters'
    factors to the experts module, whose forward folds each into its local experts' weights only; the factors'
    gradients then hold this rank's experts' rows (FSDP sums them with the other ranks' like any replicated
    parameter's)."""
    self._check_forward_args(x, *args, **kwargs)
    kwargs.pop("adapter_names", None)
    experts = self.get_base_layer()
    active = []
    if not self.disable_adapters and not self.merged:
        active = [a for a in self.active_adapters if a in self.lora_A]
    elif self.disable_adapters and self.merged:
        self.unmerge()
    pushed = experts._hybridflow_ep.setdefault("lora", [])
    mine = [(self.parameter_name, *self.get_delta_factors(a)) for a in active]
    pushed.extend(mine)
    try:
        return self.base_layer(x, *args, **kwargs)
    finally:
        del pushed[len(pushed) - len(mine):]


def expert_forward(x: torch.Tensor, counts: list[int], gate_up: torch.Tensor, down: torch.Tensor, act_fn) -> torch.Tensor:
    """Rows ``x`` grouped by expert (``counts[e]`` rows for local expert e, in order) through their experts:
    ``down_e(act(gate_e(x)) * up_e(x))``."""
    outs = []
    for e, rows in enumerate(x.split(counts)):
        if rows.shape[0] == 0:
            continue
        gate, up = F.linear(rows, gate_up[e]).chunk(2, dim=-1)
        outs.append(F.linear(act_fn(gate) * up, down[e]))
    if outs:
        return torch.cat(outs)
    # no rows reached this rank's experts: an empty result still joined to ``x``, so the backward runs the
    # all-to-all that brought ``x`` here, as on the peers that did get rows (a result cut off from ``x`` skipped it
    # and left those peers waiting in that all-to-all: seen with pipeline micro-batches of a few rows)
    return x.new_zeros((0, down.shape[1])) + x.sum() * 0


class _TakeRows(torch.autograd.Function):
    """This tp rank's rows ``[lo, hi)`` of a tensor every tp rank holds whole; backward gathers the rows' gradients
    from the group, so every rank gets the whole (identical) gradient, as for any replicated activation."""

    @staticmethod
    def forward(ctx, x, lo, hi, chunk, group):
        ctx.shape, ctx.chunk, ctx.group = x.shape, chunk, group
        return x[lo:hi]

    @staticmethod
    def backward(ctx, grad):
        return _gather_rows(grad, ctx.shape[0], ctx.chunk, ctx.group), None, None, None, None


class _GatherRows(torch.autograd.Function):
    """The tp ranks' row slices put back together (every rank gets all ``n`` rows); backward keeps this rank's
    rows of the gradient (which is the same on every rank)."""

    @staticmethod
    def forward(ctx, x, n, lo, hi, chunk, group):
        ctx.lo, ctx.hi = lo, hi
        return _gather_rows(x, n, chunk, group)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.lo:ctx.hi], None, None, None, None, None


def _gather_rows(x: torch.Tensor, n: int, chunk: int, group) -> torch.Tensor:
    """All-gather slices of at most ``chunk`` rows (the last ones may be shorter: padded for the collective)."""
    x = x.contiguous()
    padded = torch.cat([x, x.new_zeros((chunk - x.shape[0],) + tuple(x.shape[1:]))]) if x.shape[0] < chunk else x
    parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, padded, group=group)
    return torch.cat(parts)[:n]


def _ep_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """The experts module's forward under expert parallelism (installed by :func:`apply_expert_parallel`).

    When the expert group spans the tp ranks (which hold the same tokens), each dispatches only its slice of the
    tokens and the outputs are gathered over tp afterwards: every token reaches its experts once."""
    split = self._hybridflow_ep.get("tp_split")
    if split is None:
        return _dispatch(self, hidden_states, top_k_index, top_k_weights)
    group, tp, index = split
    n = hidden_states.shape[0]
    chunk = -(-n // tp)
    lo, hi = min(index * chunk, n), min((index + 1) * chunk, n)
    out = _dispatch(self, _TakeRows.apply(hidden_states, lo, hi, chunk, group), top_k_index[lo:hi],
                    _TakeRows.apply(top_k_weights, lo, hi, chunk, group))
    return _GatherRows.apply(out, n, lo, hi, chunk, group)


def _dispatch(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
    """Route the rows to their experts' ranks and back (all-to-all over the expert group)."""
    spec = self._hybridflow_ep
    group, ep, local = spec["group"], spec["ep"], spec["local"]
    tokens, k = top_k_index.shape
    flat = top_k_index.reshape(-1)
    order = torch.sort(flat, stable=True).indices  # pairs sorted by expert, so by destination rank
    experts_sorted = flat[order]
    token_of = order // k
    dest = torch.div(experts_sorted, local, rounding_mode="floor")
    send = torch.bincount(dest, minlength=ep)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_l, recv_l = send.tolist(), recv.tolist()
    x = _AllToAll.apply(hidden_states[token_of], recv_l, send_l, group)
    with torch.no_grad():
        local_ids = _exchange(experts_sorted - dest * local, recv_l, send_l, group)
    # the received rows come from each source rank sorted by expert; group them by expert across sources
    by_expert = torch.sort(local_ids, stable=True).indices
    counts = torch.bincount(local_ids, minlength=local).tolist()
    gate_up, down = _local_weights(self)
    y_sorted = expert_forward(x[by_expert], counts, gate_up, down, self.act_fn)
    y = y_sorted[torch.argsort(by_expert)] if y_sorted.shape[0] else y_sorted
    back = _AllToAll.apply(y, send_l, recv_l, group)
    weights = top_k_weights.reshape(-1)[order].unsqueeze(-1)
    out = torch.zeros_like(hidden_states)
    return out.index_add(0, token_of, (back * weights).to(out.dtype))


def apply_expert_parallel(model: nn.Module, ep_mesh, key: str = "megatron.expert_model_parallel_size",
                          tp_split=None) -> list[nn.Module]:
    """Split every MoE experts module of ``model`` over ``ep_mesh`` (in place) and install the all-to-all forward;
    returns the experts modules (FSDP2 shards them over their own mesh).  ``tp_split``: ``(tp group, tp, tp
    index)`` when the expert group spans the tensor-parallel ranks (``ParallelDims.expert_token_split``)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    ep = ep_mesh.size()
    found = moe_experts(model)
    counts = {layout.num_experts for _, _, layout in found}
    problem = expert_parallel_problem(min(counts) if counts else None, ep, key)
    if problem is None and len(counts) > 1:
        problem = f"{key}={ep}: the model's MoE layers have different expert counts {sorted(counts)}"
    for n in counts:
        problem = problem or expert_parallel_problem(n, ep, key)
    if problem:
        raise ExpertParallelError(problem)
    modules = []
    for _, module, layout in found:
        _split(module, layout, ep_mesh, ep, distribute_tensor, Shard)
        module._hybridflow_ep.update(tp_split=tp_split, index=ep_mesh.get_local_rank())
        modules.append(module)
    split = {id(m) for m in modules}
    for wrapper in model.modules():  # peft's LoRA on the expert stacks (ParamWrapper, nested one per parameter)
        if hasattr(wrapper, "get_delta_factors") and hasattr(wrapper, "parameter_name") \
                and id(wrapper.get_base_layer()) in split:
            wrapper.forward = types.MethodType(_lora_experts_forward, wrapper)
    return modules


def _split(module: nn.Module, layout: ExpertsLayout, ep_mesh, ep: int, distribute_tensor, Shard) -> None:
    for name in ("gate_up_proj", "down_proj"):
        param = getattr(module, name)
        sharded = nn.Parameter(distribute_tensor(param.data, ep_mesh, [Shard(0)]), requires_grad=param.requires_grad)
        setattr(module, name, sharded)
    module._hybridflow_ep = {"group": ep_mesh.get_group(), "ep": ep, "local": layout.num_experts // ep}
    module.forward = types.MethodType(_ep_forward, module)
