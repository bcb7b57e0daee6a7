"""Mixture-of-experts routers in the actor's training forward: expert-load metrics and the auxiliary loss.

A MoE layer's router scores every token against ``E`` experts and sends it to its top ``k``.  Two things are
read from the routers while the actor trains (Qwen3-MoE, DeepSeek-V3, Mixtral, Qwen2-MoE):

* **expert load** -- how many of the forward's valid tokens each expert of each layer received.  Reported as
  verl reports the rollout's routing (``rollout/moe/*`` in its ``metric_utils``), here measured on the update's
  own forward passes (prompt and response tokens): ``actor/moe/{max,min,avg}_vio/layer_i`` and their
  ``/max`` and ``/avg`` over layers, where a layer's violation of expert ``e`` is ``share_e * E - 1``
  (0 everywhere = perfectly balanced; ``max_vio`` = 1 means the busiest expert takes twice its share);
* **the load-balancing auxiliary loss** (Switch Transformer, Fedus et al. 2021, eq. 4-6; transformers'
  ``load_balancing_loss_func``): ``E * sum_e f_e * P_e`` over all MoE layers' tokens, ``f_e`` the share of
  top-k assignments going to expert ``e`` and ``P_e`` its mean router probability.  verl's FSDP actor never
  adds it -- it passes no labels and leaves ``output_router_logits`` at the checkpoint's value (``false`` in
  every released MoE config), and its Megatron path sets ``moe_router_load_balancing_type="none"`` because
  the loss hurts RL.  hybridflow does the same by default; with
  ``actor_rollout_ref.model.override_config.output_router_logits=true`` (transformers' switch for training
  with the loss) the actor adds ``router_aux_loss_coef`` x the loss to its objective and reports
  ``actor/moe_aux_loss``.  A model that defines no coefficient (DeepSeek-V3 balances its experts with a
  routing bias instead) refuses the override.

The routers are found and hooked through :func:`hybridflow.engine.transformers_adapter.router_modules`; the
valid-token mask is the ``attention_mask`` the forward is called with (all tokens when it is packed).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from hybridflow.engine.transformers_adapter import router_modules, text_config

__all__ = ["MoESpec", "MoEUpdateTracker", "RouterRecord", "record_routing", "load_balancing_loss",
           "expert_load_counts", "expert_load_metrics"]

_EXPERT_COUNT_FIELDS = ("num_experts", "n_routed_experts", "num_local_experts")


@dataclass(frozen=True)
class MoESpec:
    """The routing shape of a MoE model: ``num_experts`` per layer, ``top_k`` per token, and the auxiliary-loss
    coefficient the actor adds (0: off)."""

    num_experts: int
    top_k: int
    aux_loss_coef: float

    @classmethod
    def of(cls, model: nn.Module) -> "MoESpec | None":
        """The spec of ``model`` (None for a dense model)."""
        config = text_config(model.config)
        experts = next((getattr(config, f) for f in _EXPERT_COUNT_FIELDS if getattr(config, f, None)), None)
        top_k = getattr(config, "num_experts_per_tok", None)
        if not experts or not top_k or not router_modules(model):
            return None
        coef = 0.0
        if getattr(config, "output_router_logits", False):
            raw = getattr(config, "router_aux_loss_coef", None)
            if raw is None:
                raise ValueError(
                    f"actor_rollout_ref.model.override_config.output_router_logits=true asks for the router's "
                    f"auxiliary loss, but {config.model_type} defines no router_aux_loss_coef (DeepSeek-V3 balances "
                    "its experts with a routing bias, without an auxiliary loss); remove the override")
            coef = float(raw)
        return cls(int(experts), int(top_k), coef)


@dataclass
class RouterRecord:
    """What the routers of one forward produced: per MoE layer, ``(router_logits (N, E), expert ids (N, k))``,
    and which of the N token rows are real tokens (``valid``, (N,) bool)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    valid: torch.Tensor | None = None


@contextlib.contextmanager
def record_routing(module: nn.Module) -> Iterator[RouterRecord]:
    """Record the routers' outputs of the forward passes of ``module`` run inside the block.

    Only calls made while ``module``'s own forward runs count: activation checkpointing re-runs the layers in
    the backward pass, after the forward returned, and those repeats are ignored.
    """
    record = RouterRecord([])
    active = [False]

    def before(_, args, kwargs):
        mask = kwargs.get("attention_mask")
        record.valid = mask.reshape(-1).bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        active[0] = True

    def after(*_):
        active[0] = False

    def on_router(_, __, output):
        if active[0]:
            record.layers.append((output[0], output[2]))

    handles = [module.register_forward_pre_hook(before, with_kwargs=True), module.register_forward_hook(after)]
    handles += [router.register_forward_hook(on_router) for router in router_modules(module)]
    try:
        yield record
    finally:
        for h in handles:
            h.remove()


def _valid_rows(record: RouterRecord, n: int, device) -> torch.Tensor:
    if record.valid is None or record.valid.numel() != n:
        return torch.ones(n, dtype=torch.bool, device=device)
    return record.valid.to(device)


def load_balancing_loss(record: RouterRecord, spec: MoESpec) -> torch.Tensor:
    """``E * sum_e f_e * P_e`` over the valid tokens of every MoE layer of the recorded forward (transformers'
    ``load_balancing_loss_func`` with an attention mask: the routers' softmax, their top-k choice)."""
    logits = torch.cat([lg for lg, _ in record.layers])  # (layers * N, E)
    n = record.layers[0][0].shape[0]
    valid = _valid_rows(record, n, logits.device).repeat(len(record.layers)).float()
    probs = torch.softmax(logits.float(), dim=-1)
    top = torch.topk(probs, spec.top_k, dim=-1).indices
    chosen = F.one_hot(top, spec.num_experts).float()  # (T, k, E)
    weight = valid.sum().clamp_min(1.0)
    tokens_per_expert = (chosen * valid[:, None, None]).sum(0) / weight  # (k, E)
    prob_per_expert = (probs * valid[:, None]).sum(0) / weight  # (E,)
    return (tokens_per_expert * prob_per_expert[None]).sum() * spec.num_experts


def expert_load_counts(record: RouterRecord, num_experts: int) -> torch.Tensor:
    """(layers, E) top-k assignments of the valid tokens to each expert, per MoE layer."""
    rows = []
    for logits, experts in record.layers:
        valid = _valid_rows(record, logits.shape[0], experts.device)
        rows.append(torch.bincount(experts[valid].reshape(-1).long(), minlength=num_experts)[:num_experts])
    return torch.stack(rows).float() if rows else torch.zeros(0, num_experts)


def expert_load_metrics(counts: torch.Tensor, prefix: str = "actor/moe") -> dict[str, float]:
    """verl's load-balance violations of (layers, E) assignment counts: per layer and expert
    ``share * E - 1``, then per layer its max, min and mean absolute value, and those over layers."""
    if counts.numel() == 0 or float(counts.sum()) == 0.0:
        return {}
    share = counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)
    deviation = share * counts.shape[1] - 1.0
    stats = {"max_vio": deviation.max(dim=1).values, "min_vio": deviation.min(dim=1).values,
             "avg_vio": deviation.abs().mean(dim=1)}
    metrics: dict[str, float] = {}
    for name, per_layer in stats.items():
        for i, value in enumerate(per_layer.tolist()):
            metrics[f"{prefix}/{name}/layer_{i}"] = value
        metrics[f"{prefix}/{name}/max"] = float(per_layer.max())
        metrics[f"{prefix}/{name}/avg"] = float(per_layer.mean())
    return metrics


class MoEUpdateTracker:
    """The actor update's view of the routers: hooks each micro-batch's forward, gives the auxiliary-loss term
    to add (when enabled) and the mini-batch's expert-load metrics (summed over micro-batches and ranks)."""

    def __init__(self, spec: MoESpec, moe_layers: int):
        self.spec = spec
        self.moe_layers = moe_layers
        self._counts: torch.Tensor | None = None

    @classmethod
    def of(cls, module: nn.Module) -> "MoEUpdateTracker | None":
        spec = MoESpec.of(module)
        return None if spec is None else cls(spec, len(router_modules(module)))

    def forward(self, module: nn.Module):
        return record_routing(module)

    def loss_term(self, record: RouterRecord, share: torch.Tensor | float) -> torch.Tensor | None:
        """Count the record's expert load; return ``share`` x the auxiliary loss (None when it is off).
        ``share``: the micro-batch's weight in the mini-batch objective (its tokens / all ranks' tokens x dp size,
        as every other loss term of the update)."""
        if not record.layers:
            return None
        counts = expert_load_counts(record, self.spec.num_experts).detach().cpu()
        self._counts = counts if self._counts is None else self._counts + counts
        if not self.spec.aux_loss_coef:
            return None
        return load_balancing_loss(record, self.spec) * share

    def pop_metrics(self, all_reduce_sum) -> dict[str, float]:
        """The mini-batch's ``actor/moe/*`` metrics; ``all_reduce_sum(list[float]) -> list[float]`` sums over ranks
        (a collective: every rank calls it, with zeros when it saw no token)."""
        counts, self._counts = self._counts, None
        if counts is None:  # no forward on this rank: it still takes part in the sum
            counts = torch.zeros(self.moe_layers, self.spec.num_experts)
        total = torch.tensor(all_reduce_sum(counts.reshape(-1).tolist())).view_as(counts)
        return expert_load_metrics(total)
