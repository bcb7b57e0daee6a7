"""Per-response-token distributions beyond the sampled token, for top-k distillation (verl's
``distillation.distillation_loss.loss_mode=forward_kl_topk``).

* :func:`response_topk` -- the teacher's side: its ``k`` most likely next tokens at every response position, ids and
  log-probs (``B x R x k``), from one forward;
* :func:`response_outputs_at` -- the student's side, in the update: the usual per-token log-probs (and entropy) plus
  the log-probs of given token ids at every response position (the teacher's top-k), from one forward, with
  gradients.

Both run the same compact layouts as :func:`hybridflow.engine.forward.per_position_outputs` (packed or trimmed rows,
Ulysses sequence parallelism); logits split over the vocabulary by tensor parallelism are gathered first (the full
log-softmax of a response position is needed).  The student's side keeps the (response tokens x vocabulary)
log-softmax of a micro-batch for its backward, as verl's top-k loss does: size the micro-batches for it.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridflow.engine.forward import per_position_outputs
from hybridflow.engine.transformers_adapter import forward_parameters, unwrap_peft
from hybridflow.engine.vocab_parallel import is_vocab_sharded

__all__ = ["response_outputs_at", "response_topk"]


def _log_softmax_at_kept(module, ids, attn, pos, keep, temperature: float, mm: dict) -> torch.Tensor:
    """Log-softmax over the vocabulary (fp32) of the positions ``keep`` selects (see ``per_position_outputs``)."""
    to_keep = keep is not None and "logits_to_keep" in forward_parameters(type(unwrap_peft(module)))[0]
    extra = {"logits_to_keep": keep} if to_keep else {}
    logits = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, **extra, **mm).logits
    if keep is not None and not to_keep:
        logits = logits[:, -keep:] if isinstance(keep, int) else logits[:, keep]
    if is_vocab_sharded(logits):  # tensor parallelism: every rank needs the whole distribution
        logits = logits.full_tensor()
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def _response(module: nn.Module, batch: dict, head, use_remove_padding: bool, sequence_parallel,
              multi_modal_inputs) -> dict[str, torch.Tensor]:
    R = batch["responses"].shape[-1]
    outs = per_position_outputs(module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], head,
                                use_remove_padding, first_col=batch["input_ids"].shape[-1] - R - 1,
                                multi_modal_inputs=multi_modal_inputs, sequence_parallel=sequence_parallel)
    return {k: v[:, -R - 1 : -1] for k, v in outs.items()}


@torch.no_grad()
def response_topk(module: nn.Module, batch: dict, k: int, temperature: float = 1.0, use_remove_padding: bool = True,
                  sequence_parallel=None, multi_modal_inputs=None) -> dict[str, torch.Tensor]:
    """``topk_log_probs`` / ``topk_ids`` (B, R, k): the ``k`` most likely tokens of every response position (most
    likely first) under logits / ``temperature``, and ``log_probs`` (B, R) of the sampled tokens."""

    def head(module, ids, attn, pos, keep, labels, **mm):
        log_probs = _log_softmax_at_kept(module, ids, attn, pos, keep, temperature, mm)
        top = log_probs.topk(k, dim=-1)
        return {"log_probs": log_probs.gather(-1, labels.unsqueeze(-1).long()).squeeze(-1),
                "topk_log_probs": top.values, "topk_ids": top.indices}

    return _response(module, batch, head, use_remove_padding, sequence_parallel, multi_modal_inputs)


def response_outputs_at(module: nn.Module, batch: dict, token_ids: torch.Tensor, temperature: float = 1.0,
                        calculate_entropy: bool = False, entropy_grad: bool = True, use_remove_padding: bool = True,
                        sequence_parallel=None, multi_modal_inputs=None) -> dict[str, torch.Tensor]:
    """``log_probs`` (B, R) of the sampled tokens, ``entropy`` (B, R) when asked, and ``log_probs_at`` (B, R, k): the
    log-probs of ``token_ids`` (B, R, k) at each response position -- all from one forward, with gradients."""
    R = batch["responses"].shape[-1]

    def head(module, ids, attn, pos, keep, labels, **mm):
        log_probs = _log_softmax_at_kept(module, ids, attn, pos, keep, temperature, mm)
        out = {"log_probs": log_probs.gather(-1, labels.unsqueeze(-1).long()).squeeze(-1), "vocab": log_probs}
        if calculate_entropy:
            ent = -(log_probs.exp() * log_probs).sum(-1)
            out["entropy"] = ent if entropy_grad else ent.detach()
        return out

    outs = _response(module, batch, head, use_remove_padding, sequence_parallel, multi_modal_inputs)
    vocab = outs.pop("vocab")
    outs["log_probs_at"] = vocab.gather(-1, token_ids[:, -R:].long())
    return outs
