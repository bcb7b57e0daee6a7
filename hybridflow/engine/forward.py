"""Per-token forward passes over a micro-batch without spending compute on padding.

Rows arrive as ``[left pad | prompt | response | right pad]`` (``input_ids``, ``attention_mask``,
``position_ids`` of shape (B, L), ``responses`` (B, R)).  Two ways to skip the padding:

* **packed** (``use_remove_padding=True``): all valid tokens of the micro-batch are laid end to end in
  one row of length N = Σ mask, with ``position_ids`` restarting at 0 for every sequence and no
  attention mask.  transformers 5 derives a block-diagonal causal mask from the restarts (flash-attn
  varlen on GPU, a packed mask for sdpa/eager on CPU), so sequences do not see each other and the
  result equals the padded forward (checked in ``tests/engine/test_forward.py``).
* **trimmed** (``use_remove_padding=False``, or models whose attention ignores packing): the columns
  that are padding in every row are cut off, so at most the ragged part of the batch is padding.

Packing pays off where attention can stay within each sequence: flash-attention's varlen path on GPU, and
elsewhere (CPU; sdpa on GPU) :mod:`hybridflow.engine.padded_attention`, which pads only inside attention (a
right-padded batch with sdpa's ``is_causal``) while every other layer sees the packed row.  Without either (eager
attention, sliding-window or soft-capped models, VLMs) transformers would turn the packed row into a dense
block-diagonal N x N mask -- O(N^2) attention work instead of O(sum L_i^2), and no ``is_causal`` fast path -- so
``use_packed_layout`` keeps the trimmed layout there; see its docstring for the measurements.

Vision-language batches (``data/multimodal.py``) add per-row ``multi_modal_inputs`` (pixel patches and grids,
concatenated over the micro-batch's rows in order, which is the order of their image tokens in either layout)
and ``position_ids`` of shape (B, 4, L) (text positions + M-RoPE, ``data/mrope.py``): the trimmed layout hands
the model the (3, B, L) M-RoPE rows, the packed one the (4, 1, N) rows whose first row marks where each
sequence starts.

With Ulysses sequence parallelism (``sequence_parallel`` given, sp > 1) the micro-batch is always packed and the
packed row is split along the token axis over the sp group (``engine/ulysses_forward.py``); the outputs come back
gathered, equal on every rank of the group.

Outputs are computed in that compact layout, scattered back to (B, L) and sliced to the response:
the output at position t is the prediction for token t+1, so response token j (at P + j) reads
position P + j - 1, i.e. ``[:, -R-1:-1]``.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from hybridflow.data.mrope import model_position_ids
from hybridflow.engine.padded_attention import padded_attention, supports_padded_attention
from hybridflow.engine.parallel.pipeline_forward import PipelinePass
from hybridflow.engine.transformers_adapter import attention_implementation, forward_parameters, unwrap_peft
from hybridflow.engine.ulysses_forward import SequenceParallel, sequence_parallel_outputs
from hybridflow.engine.vision import merge_multi_modal_inputs, vision_in_every_step
from hybridflow.engine.vocab_parallel import (
    is_vocab_sharded,
    vocab_parallel_logprob_entropy,
    vocab_parallel_sum_pi_squared,
)

__all__ = [
    "response_log_probs", "response_token_outputs", "response_values", "last_token_scores", "per_position_outputs",
    "next_token_log_probs", "logprob_entropy", "use_packed_layout", "eval_mode", "token_outputs_pass", "values_pass",
]


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Run ``module`` in eval mode (no dropout) inside the block and restore its previous mode after.

    The rollout generates with the actor's own module, which the update leaves in training mode.
    ``Module.train()`` walks every submodule, so callers switch once around a whole generation rather
    than around every decode step (a per-step switch cost ~15 % of the decode time of a tiny model).
    Nested uses are free: the inner one finds the module already in eval mode.
    """
    was_training = module.training
    if was_training:
        module.eval()
    try:
        yield module
    finally:
        if was_training:
            module.train()

HeadFn = Callable[
    [nn.Module, torch.Tensor, torch.Tensor | None, torch.Tensor, "int | torch.Tensor | None", torch.Tensor],
    dict[str, torch.Tensor],
]

_CHUNK_ROWS = 2048  # tokens per chunk when turning logits into log-probs / entropy


def logprob_entropy(
    logits: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool, chunk: int = _CHUNK_ROWS,
    entropy_grad: bool = True, use_torch_compile: bool = False, entropy_checkpointing: bool = False,
):
    """Log-probs of ``labels`` and (optionally) entropies for (N, V) logits, ``chunk`` rows at a time.

    Chunking (in ``algorithms/entropy.py``) bounds the fp32 softmax temporaries to ``chunk x V``.
    ``entropy_grad=False`` computes the entropy outside autograd: a metric-only entropy then costs no
    saved softmax and no backward work.  ``use_torch_compile`` runs the per-chunk kernels compiled where that
    was measured to pay off (``engine/compiled_kernels.py``).  ``entropy_checkpointing`` (verl's key) keeps no
    softmax for the entropy's backward and recomputes it there instead: less memory, one more pass.
    Logits split over the vocabulary by tensor parallelism (a sharded ``DTensor``) are reduced shard by shard
    (``engine/vocab_parallel.py``), never gathered; the compiled kernels and entropy checkpointing do not apply
    there.
    """
    if is_vocab_sharded(logits):  # tensor parallelism: the LM head's logits are split over the vocabulary
        return vocab_parallel_logprob_entropy(logits, labels, calculate_entropy, entropy_grad, chunk)
    if entropy_checkpointing and calculate_entropy and entropy_grad and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        log_probs, _ = logprob_entropy(logits, labels, False, chunk, use_torch_compile=use_torch_compile)
        entropy = checkpoint(lambda x: logprob_entropy(x, labels, True, chunk, use_torch_compile=use_torch_compile)[1],
                             logits, use_reentrant=False)
        return log_probs, entropy
    from hybridflow.algorithms.entropy import entropy_from_logits_with_chunking, logprobs_from_logits
    from hybridflow.engine.compiled_kernels import compiled_entropy, compiled_logprob, wants_compiled

    if wants_compiled(use_torch_compile, logits.shape[-1]):
        rows = range(0, logits.shape[0], chunk)
        log_probs = torch.cat([compiled_logprob(logits[i : i + chunk].float(), labels[i : i + chunk].long())
                               for i in rows]) if len(rows) else logits.new_zeros(0, dtype=torch.float32)
        entropy = None
        if calculate_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy = torch.cat([compiled_entropy(logits[i : i + chunk].float()) for i in rows]) \
                    if len(rows) else logits.new_zeros(0, dtype=torch.float32)
        return log_probs, entropy
    log_probs = logprobs_from_logits(logits, labels, chunk_size=chunk)
    entropy = None
    if calculate_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits_with_chunking(logits, chunk_size=chunk)
    return log_probs, entropy


_VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def _packed_attention(module: nn.Module, device: torch.device) -> str | None:
    """How attention stays within each sequence of a packed row: ``"varlen"`` (flash-attention on CUDA),
    ``"padded"`` (``engine/padded_attention.py``), or None (only a dense block-diagonal mask would)."""
    config = getattr(module, "config", None)
    if device.type == "cuda" and config is not None and attention_implementation(config) in _VARLEN_ATTENTION:
        return "varlen"
    return "padded" if supports_padded_attention(module) else None


def use_packed_layout(module: nn.Module, device: torch.device, use_remove_padding: bool) -> bool:
    """Pack the micro-batch into one row where attention can stay within each sequence.

    With flash-attention on CUDA the packed row costs sum L_i^2 attention work and no padding at all; a text
    model running sdpa (CPU, or GPU without flash-attn) gets the same from ``engine/padded_attention.py``.
    Otherwise the packed row would get a dense block-diagonal N x N mask (N = all valid tokens of the
    micro-batch), so attention would cost N^2 and lose the causal fast path, while the trimmed padded batch runs
    B x L_max^2 with ``is_causal``: the trimmed layout is used there.  Measured on this project's CPU
    (``benchmarks/bench_train.py``, and the step shape of ``bench_vs_trl.py``: 128 rows of 6-12 tokens, fp32,
    one thread): forward + backward 76 ms packed with padded attention, 101 ms trimmed, 132 ms packed with the
    dense mask; ``benchmarks/RESULTS.md`` section 19 has the update times.  The outputs of the layouts agree to
    1e-5 (``tests/engine/test_forward.py``).
    """
    if not use_remove_padding:
        return False
    return _packed_attention(module, device) is not None


def per_position_outputs(
    module: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    head_fn: HeadFn,
    use_remove_padding: bool,
    packed: bool | None = None,
    first_col: int = 0,
    multi_modal_inputs=None,
    sequence_parallel: SequenceParallel | None = None,
) -> dict[str, torch.Tensor]:
    """Run ``head_fn`` on the compact (packed or trimmed) batch; return its outputs as (B, L) tensors.

    ``head_fn(module, ids, attention_mask_or_None, position_ids, keep, labels, **model_kwargs)`` returns a dict of
    per-position tensors for the positions ``keep`` selects along the sequence dimension of the model's outputs (``None``:
    all; an int k: the last k; a 1-D index tensor); ``labels`` (b, kept) are the next tokens of those positions.
    ``sequence_parallel``: this rank's Ulysses group (sp > 1 packs and splits the row over it).
    ``first_col``: only columns >= ``first_col`` of the (B, L) layout are wanted (the rest are left 0), so a
    head can skip work on the prompt -- for a causal LM the vocabulary projection and log-softmax of every
    prompt position, which is most of a forward's memory and a large share of its FLOPs at 100k+ vocabularies.
    ``packed=None`` picks the layout with :func:`use_packed_layout`; True/False forces one (tests);
    :data:`ALIGNED` is the batch-invariant layout of ``rollout.exact_log_probs`` (see :func:`_aligned_outputs`).
    ``multi_modal_inputs``: the rows' dicts of pixel inputs (a VLM batch), passed to ``head_fn`` as keyword
    arguments of the model.
    """
    mask = attention_mask.bool()
    if packed == ALIGNED:
        if multi_modal_inputs is not None or (sequence_parallel is not None and sequence_parallel.size > 1):
            raise ValueError("the aligned (batch-invariant) layout of exact_log_probs takes text rows without "
                             "sequence parallelism")
        return _aligned_outputs(module, input_ids, mask, head_fn)
    if packed is None:
        packed = use_packed_layout(module, input_ids.device, use_remove_padding)
    mm = merge_multi_modal_inputs(multi_modal_inputs, input_ids.device)
    sharded = hasattr(module, "unshard")  # an FSDP2 root: every rank must run the vision tower each pass
    with vision_in_every_step(module, bool(mm), sharded) if multi_modal_inputs is not None else contextlib.nullcontext():
        if sequence_parallel is not None and sequence_parallel.size > 1:
            return sequence_parallel_outputs(module, input_ids, attention_mask, position_ids, head_fn, first_col, mm,
                                             sequence_parallel)
        if packed:
            return _packed_outputs(module, input_ids, mask, position_ids, head_fn, first_col, mm)
        return _trimmed_outputs(module, input_ids, attention_mask, position_ids, head_fn, first_col, mm)


def _packed_outputs(module: nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor,
                    head_fn: HeadFn, first_col: int, mm: dict) -> dict[str, torch.Tensor]:
    """The valid tokens of every row as one packed row (attention kept per row: padded inside, or the model's
    own varlen path), outputs scattered back to (B, L)."""
    B, L = input_ids.shape
    ids = input_ids[mask].unsqueeze(0)
    if position_ids.dim() == 3:  # (B, 4, L) -> (1, 4, N)
        pos = model_position_ids(position_ids.transpose(0, 1)[:, mask].unsqueeze(0), packed=True)
    else:
        pos = position_ids[mask].unsqueeze(0)
    keep, where = None, mask
    if first_col > 0:
        wanted = torch.arange(L, device=mask.device) >= first_col
        keep = wanted.expand(B, L)[mask].nonzero().flatten()
        where = mask & wanted
    pad_inside = _packed_attention(module, input_ids.device) == "padded"
    with padded_attention(mask) if pad_inside else contextlib.nullcontext({}) as pack:
        outs = head_fn(module, ids, None, pos, keep, _take(torch.roll(ids, shifts=-1, dims=1), keep), **mm, **pack)
    return _scatter(outs, (B, L), lambda buf, v: buf.__setitem__(where, v[0]))


def _trimmed_outputs(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     position_ids: torch.Tensor, head_fn: HeadFn, first_col: int, mm: dict) -> dict[str, torch.Tensor]:
    """The padded batch cut to the columns some row uses, outputs of the wanted columns written back to (B, L)."""
    B, L = input_ids.shape
    cols = attention_mask.bool().any(dim=0).nonzero().flatten()
    lo, hi = (int(cols[0]), int(cols[-1]) + 1) if cols.numel() else (0, L)
    start = min(max(first_col, lo), hi - 1)
    keep = None if start == lo else hi - start
    pos = model_position_ids(position_ids[..., lo:hi])
    ids = input_ids[:, lo:hi]
    outs = head_fn(module, ids, attention_mask[:, lo:hi], pos, keep, _take(torch.roll(ids, shifts=-1, dims=1), keep),
                   **mm)
    return _scatter(outs, (B, L), lambda buf, v: buf.__setitem__((slice(None), slice(start, hi)), v))


def next_token_log_probs(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, use_remove_padding: bool) -> torch.Tensor:
    """(B, L) log-probability the model gives token t + 1 of each row at position t (temperature 1), through the
    layout :func:`use_packed_layout` picks (packed rows with ``use_remove_padding`` where the model allows, else
    the trimmed padded batch); 0 at padding.  A row's last position predicts nothing of its own (the next row's
    first token in a packed row, a pad token otherwise): a loss masks it, as SFT's shifted loss mask does."""
    head = _lm_head(1.0, calculate_entropy=False, entropy_grad=False)
    return per_position_outputs(module, input_ids, attention_mask, position_ids, head, use_remove_padding)["log_probs"]


# The batch-invariant layout (``packed=ALIGNED``, set by ``actor_rollout_ref.rollout.exact_log_probs``): every row
# starts at column 0 (its left padding removed), the batch is right-padded to a multiple of ALIGN_QUANTUM columns
# and runs with plain causal attention and every position's logits.  A causal row then computes exactly what it
# computes alone in a forward right-padded to a multiple of the quantum -- what the hf rollout's exact mode runs
# (rollout/hf/exact.py) -- whatever its neighbours: the packed layout's offsets inside the pack and the trimmed
# layout's left padding change the attention kernel's block boundaries, hence the last bits.
ALIGNED = "aligned"
ALIGN_QUANTUM = 16


def _aligned_outputs(module: nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, head_fn: HeadFn):
    B, L = input_ids.shape
    lengths = mask.sum(dim=1)
    starts = mask.to(torch.int8).argmax(dim=1)  # rows are contiguous: the first valid column
    longest = int(lengths.max()) if B else 0
    width = max(ALIGN_QUANTUM, -(-longest // ALIGN_QUANTUM) * ALIGN_QUANTUM)
    offs = torch.arange(width, device=input_ids.device)
    valid = offs[None, :] < lengths[:, None]
    src = (starts[:, None] + offs[None, :]).clamp(max=L - 1)
    ids = torch.where(valid, input_ids.gather(1, src), torch.zeros_like(src))
    pos = offs.expand(B, width)
    outs = head_fn(module, ids, None, pos, None, torch.roll(ids, shifts=-1, dims=1))

    def put(buf: torch.Tensor, v: torch.Tensor) -> None:
        rows = torch.arange(B, device=ids.device)[:, None].expand(B, width)
        buf[rows[valid], src[valid]] = v[valid]

    return _scatter(outs, (B, L), put)


def _scatter(outs: dict[str, torch.Tensor], shape: tuple[int, int], put) -> dict[str, torch.Tensor]:
    full = {}
    for k, v in outs.items():
        buf = v.new_zeros(shape + tuple(v.shape[2:]))
        put(buf, v)
        full[k] = buf
    return full


def _take(x: torch.Tensor, keep: int | torch.Tensor | None) -> torch.Tensor:
    """The positions ``keep`` selects along dim 1 (see :func:`per_position_outputs`)."""
    if keep is None:
        return x
    return x[:, -keep:] if isinstance(keep, int) else x[:, keep]


def _accepts_logits_to_keep(module: nn.Module) -> bool:
    """Whether the causal LM's forward projects only the positions it is asked for (transformers >= 4.50)."""
    return "logits_to_keep" in forward_parameters(type(unwrap_peft(module)))[0]


def _sum_pi_squared(logits: torch.Tensor, chunk: int = _CHUNK_ROWS) -> torch.Tensor:
    """Σ_v π(v)² per row of (N, V) temperature-scaled logits, ``chunk`` rows at a time, outside autograd
    (it feeds the Optimal Token Baseline's energy, a statistic, never a loss)."""
    if is_vocab_sharded(logits):
        return vocab_parallel_sum_pi_squared(logits, chunk)
    from hybridflow.algorithms.token_baseline import sum_pi_squared_from_logits

    with torch.no_grad():
        return torch.cat([sum_pi_squared_from_logits(logits[i : i + chunk]) for i in range(0, logits.shape[0], chunk)])


def _lm_head(temperature: float, calculate_entropy: bool, entropy_grad: bool, sum_pi_squared: bool = False,
             use_torch_compile: bool = False, entropy_checkpointing: bool = False) -> HeadFn:
    def head(module, ids, attn, pos, keep, labels, **multi_modal):
        extra = {"logits_to_keep": keep} if keep is not None and _accepts_logits_to_keep(module) else {}
        logits = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, **extra,
                        **multi_modal).logits
        if not extra:
            logits = _take(logits, keep)
        logits = logits / temperature
        b, l, v = logits.shape
        lp, ent = logprob_entropy(
            logits.reshape(b * l, v), labels.reshape(b * l), calculate_entropy, entropy_grad=entropy_grad,
            use_torch_compile=use_torch_compile, entropy_checkpointing=entropy_checkpointing,
        )
        out = {"log_probs": lp.view(b, l)}
        if ent is not None:
            out["entropy"] = ent.view(b, l)
        if sum_pi_squared:
            out["sum_pi_squared"] = _sum_pi_squared(logits.reshape(b * l, v)).view(b, l)
        return out

    return head


def response_token_outputs(
    module: nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    use_remove_padding: bool = True,
    entropy_grad: bool = True,
    packed: bool | None = None,
    calculate_sum_pi_squared: bool = False,
    use_torch_compile: bool = False,
    entropy_checkpointing: bool = False,
    multi_modal_inputs=None,
    sequence_parallel: SequenceParallel | None = None,
    prefix_grouping: bool = False,
) -> dict[str, torch.Tensor]:
    """Per response token (B, R): ``log_probs`` = log π_T(response_t | context), and on request ``entropy``
    of π_T and ``sum_pi_squared`` = Σ_v π_T(v)², all from one forward pass (π_T: logits / temperature).

    ``entropy_grad=False``: the entropy is a metric only (no autograd graph through it).
    ``packed``, ``multi_modal_inputs``, ``sequence_parallel``: see :func:`per_position_outputs`.
    ``prefix_grouping``: the rows with equal prompts share one forward of the prompt
    (``engine/prefix_grouping.py``); text rows without sequence parallelism only.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute log-probs, got {temperature}")
    R = batch["responses"].shape[-1]
    head = _lm_head(float(temperature), calculate_entropy, entropy_grad, calculate_sum_pi_squared, use_torch_compile,
                    entropy_checkpointing)
    if prefix_grouping:
        if multi_modal_inputs is not None or (sequence_parallel is not None and sequence_parallel.size > 1):
            raise ValueError("actor_rollout_ref.actor.use_prefix_grouper=true groups text rows without sequence "
                             "parallelism only; set it to false for vision-language data or Ulysses sp > 1")
        from hybridflow.engine.prefix_grouping import grouped_response_outputs

        return grouped_response_outputs(module, batch, head)
    outs = per_position_outputs(
        module,
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        head,
        use_remove_padding,
        packed,
        first_col=batch["input_ids"].shape[-1] - R - 1,  # the response's predictions start one column early
        multi_modal_inputs=multi_modal_inputs,
        sequence_parallel=sequence_parallel,
    )
    return {k: v[:, -R - 1 : -1] for k, v in outs.items()}


def response_log_probs(
    module: nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    use_remove_padding: bool = True,
    entropy_grad: bool = True,
    packed: bool | None = None,
    use_torch_compile: bool = False,
    entropy_checkpointing: bool = False,
    multi_modal_inputs=None,
    sequence_parallel: SequenceParallel | None = None,
    prefix_grouping: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log_probs, entropy or None)`` of :func:`response_token_outputs`."""
    outs = response_token_outputs(module, batch, temperature, calculate_entropy, use_remove_padding, entropy_grad,
                                  packed, use_torch_compile=use_torch_compile, entropy_checkpointing=entropy_checkpointing,
                                  multi_modal_inputs=multi_modal_inputs, sequence_parallel=sequence_parallel,
                                  prefix_grouping=prefix_grouping)
    return outs["log_probs"], outs.get("entropy")


def _token_value_head(module, ids, attn, pos, keep, labels, **model_kwargs):
    logits = module(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False, **model_kwargs).logits
    return {"values": _take(logits[..., 0].float(), keep)}


def response_values(module: nn.Module, batch: dict[str, torch.Tensor], use_remove_padding: bool = False,
                    sequence_parallel: SequenceParallel | None = None) -> torch.Tensor:
    """Critic values V(s_t) of the state before each response token (B, R)."""
    R = batch["responses"].shape[-1]
    outs = per_position_outputs(
        module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], _token_value_head, use_remove_padding,
        sequence_parallel=sequence_parallel,
    )
    return outs["values"][:, -R - 1 : -1]


@contextlib.contextmanager
def _root_parameters(module: nn.Module) -> Iterator[None]:
    """The root's own parameters (embeddings, final norm, head) gathered while submodules are called directly.

    Calling a submodule of an FSDP2 root skips the root's pre-forward, which is what gathers them; the decoder
    layers are FSDP units of their own and gather themselves.  ``unshard`` / ``reshard`` are not recursive.
    """
    if not hasattr(module, "unshard"):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def _sequence_score_head(module, ids, attn, pos, keep, labels, **model_kwargs):
    backbone = getattr(module, module.base_model_prefix)
    with _root_parameters(module):
        hidden = backbone(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False,
                          **model_kwargs).last_hidden_state
        return {"scores": _take(module.score(hidden)[..., 0].float(), keep)}


def last_token_scores(module: nn.Module, input_ids, attention_mask, position_ids, use_remove_padding: bool = False,
                      sequence_parallel: SequenceParallel | None = None):
    """Sequence-classification score read at each row's last attended token (B,).

    We apply the classifier head at every position and pick the last valid one ourselves instead of
    relying on HF's pad-token search, which is wrong when pad == eos and the response ends with EOS.
    """
    outs = per_position_outputs(module, input_ids, attention_mask, position_ids, _sequence_score_head, use_remove_padding,
                                sequence_parallel=sequence_parallel)
    L = attention_mask.shape[1]
    last = L - 1 - attention_mask.flip(-1).long().argmax(-1)
    return outs["scores"].gather(1, last.unsqueeze(1)).squeeze(1)


# ---------------------------------------------------------------------------------------------- pipeline passes
def token_outputs_pass(module: nn.Module, response_length: int, temperature: float = 1.0,
                       calculate_entropy: bool = False, entropy_grad: bool = True, use_remove_padding: bool = True,
                       calculate_sum_pi_squared: bool = False, use_torch_compile: bool = False,
                       entropy_checkpointing: bool = False,
                       sequence_parallel: SequenceParallel | None = None) -> PipelinePass:
    """The head of :func:`response_token_outputs` for passes through pipeline stages (``TrainEngine.forward_passes``
    / ``backward_passes``): the same head, the same layout choice (:func:`use_packed_layout`, or the Ulysses row
    under sequence parallelism)."""
    kinds = ("log_probs",) + (("entropy",) if calculate_entropy else ()) + (
        ("sum_pi_squared",) if calculate_sum_pi_squared else ())
    head = _lm_head(float(temperature), calculate_entropy, entropy_grad, calculate_sum_pi_squared, use_torch_compile,
                    entropy_checkpointing)
    device = next(module.parameters()).device
    sp = sequence_parallel if sequence_parallel is not None and sequence_parallel.size > 1 else None
    return PipelinePass(head, kinds, int(response_length), packed=use_packed_layout(module, device, use_remove_padding),
                        sequence_parallel=sp)


def values_pass(module: nn.Module, response_length: int, use_remove_padding: bool = False,
                sequence_parallel: SequenceParallel | None = None) -> PipelinePass:
    """The head of :func:`response_values` for passes through pipeline stages."""
    device = next(module.parameters()).device
    sp = sequence_parallel if sequence_parallel is not None and sequence_parallel.size > 1 else None
    return PipelinePass(_token_value_head, ("values",), int(response_length),
                        packed=use_packed_layout(module, device, use_remove_padding), sequence_parallel=sp)
