"""Continuous batching over an in-process HF causal LM: prefill new requests, decode live rows.

Each :meth:`ContinuousBatcher.step` admits waiting requests into free rows (one batched, left-padded
prefill), then runs one decode forward for every live row.  Rows that finish hand their result back at
once and leave the batch (their cache rows are compacted away lazily, when enough are dead or a new
request needs the room), so short responses never wait for long ones -- the "iteration-level
scheduling" of Orca (Yu et al., OSDI 2022) that vLLM and SGLang also use.

Per step the Python work is O(1) in the batch size: every per-row quantity (next token, RoPE position,
cache column, generated length, budget, stop ids, sampling params) is a tensor, the attention mask is a
preallocated row mask updated in place, and the only host sync is one ``any()`` to learn whether some
row finished.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Callable

import torch

from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.fast_decode import fast_decoder_for
from hybridflow.rollout.kv_cache import SlotKVCache
from hybridflow.rollout.token_sampler import RowSampling, sample_next_tokens
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["GenerationRequest", "ContinuousBatcher"]

_COLUMN_QUANTUM = 64  # cache/output widths are rounded up so that growth is rare


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    on_done: Callable[[TokenOutput], None]
    on_error: Callable[[BaseException], None]


def _round_up(x: int) -> int:
    return -(-x // _COLUMN_QUANTUM) * _COLUMN_QUANTUM


class ContinuousBatcher:
    """Owns the decode batch of one model; not thread-safe by itself (callers hold ``lock``)."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, max_batch_size: int, generator: torch.Generator,
                 fast_decode: bool = True):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.model = model
        # Decode steps skip transformers' forward plumbing when the model has the supported structure.
        self.fast, self.fast_reason = fast_decoder_for(model) if fast_decode else (None, "disabled")
        self.pad_token_id = int(pad_token_id)
        self.max_rows = int(max_batch_size)
        self.generator = generator
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.lock = threading.Lock()
        self.pending: collections.deque[GenerationRequest] = collections.deque()
        self.cache: SlotKVCache | None = None
        self.out_tokens = torch.empty(0)
        self.out_log_probs = torch.empty(0)
        self._reset_rows()

    # ------------------------------------------------------------------ public
    def submit(self, req: GenerationRequest) -> None:
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id}: prompt_ids is empty; a prompt needs at least one token")
        if req.params.n != 1:
            raise ValueError(
                f"request {req.request_id}: engines take n=1 requests (got n={req.params.n}); "
                "submit the prompt n times, as generate_sequences does"
            )
        self.pending.append(req)

    def has_work(self) -> bool:
        return bool(self.pending) or bool(self.reqs)

    def step(self) -> None:
        """Admit waiting requests, then decode one token for every live row."""
        with torch.inference_mode():
            try:
                self._admit()
                if self.reqs:
                    self._decode()
            except BaseException as exc:
                self.fail_all(exc)
                raise

    def fail_all(self, exc: BaseException) -> None:
        """Hand ``exc`` to every request in flight or waiting, and start over with an empty batch."""
        victims = [r for r in self.reqs if r is not None] + list(self.pending)
        self.pending.clear()
        self._reset_rows()
        for req in victims:
            req.on_error(exc)

    def release_cache(self) -> None:
        if self.has_work():
            raise RuntimeError("cannot release the KV cache while requests are in flight")
        self.cache = None
        self.out_tokens = self.out_log_probs = torch.empty(0)

    # ------------------------------------------------------------------ batch state
    def _reset_rows(self) -> None:
        self.reqs: list[GenerationRequest | None] = []  # per row; None = finished, awaiting compaction
        self.rows: dict[str, torch.Tensor] = {}
        self.sampling: RowSampling | None = None
        self.kv_len = 0  # columns the next decode forward attends over (>= max write column + 1)
        self.n_dead = 0

    def _ensure_buffers(self, columns: int, out_width: int) -> None:
        if self.cache is None:
            self.cache = SlotKVCache(self.max_rows, _round_up(columns), self.dtype, self.device)
        elif columns > self.cache.capacity:
            self.cache.grow(_round_up(columns))
        if self.out_tokens.dim() != 2 or out_width > self.out_tokens.shape[1]:
            width = _round_up(out_width)
            tokens = torch.zeros(self.max_rows, width, dtype=torch.long, device=self.device)
            log_probs = torch.zeros(self.max_rows, width, dtype=torch.float32, device=self.device)
            if self.out_tokens.dim() == 2:
                tokens[:, : self.out_tokens.shape[1]] = self.out_tokens
                log_probs[:, : self.out_tokens.shape[1]] = self.out_log_probs
            self.out_tokens, self.out_log_probs = tokens, log_probs

    # ------------------------------------------------------------------ prefill
    def _admit(self) -> None:
        live = len(self.reqs) - self.n_dead
        if not self.pending or live >= self.max_rows:
            return
        if self.n_dead and len(self.reqs) + len(self.pending) > self.max_rows:
            self._compact()
        take = min(len(self.pending), self.max_rows - len(self.reqs))
        self._prefill([self.pending.popleft() for _ in range(take)])

    def _prefill(self, reqs: list[GenerationRequest]) -> None:
        """One left-padded forward over the *distinct* prompts of ``reqs``; identical prompts share it.

        GRPO-style rollouts submit every prompt ``rollout.n`` times.  Their prefills are identical, so the
        forward runs once per distinct prompt and the cache copies its K/V into every row that asked for
        it (the automatic prefix caching of vLLM / RadixAttention of SGLang, restricted to whole prompts).
        Each row then samples on its own, so the result is the same as prefilling every row.
        """
        first_row: dict[tuple[int, ...], int] = {}
        inverse = [first_row.setdefault(tuple(r.prompt_ids), len(first_row)) for r in reqs]
        unique = [list(k) for k in first_row]
        lens = [len(r.prompt_ids) for r in reqs]
        width = max(lens)
        budget = max(r.params.max_tokens for r in reqs)
        self._ensure_buffers(width + budget, budget)
        dev = self.device
        ids, position_ids, mask = self._prefill_inputs(unique, width)
        lens_t = torch.tensor(lens, device=dev)
        r0 = len(self.reqs)
        inverse_t = torch.tensor(inverse, device=dev)
        shared = len(unique) < len(reqs)
        self.cache.begin_prefill(r0, width - lens_t, width, source_rows=inverse_t if shared else None)
        try:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                             past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        finally:
            self.cache.end()
        last_logits = out.logits[:, -1]
        if shared:
            last_logits = last_logits[inverse_t]
        params = [r.params for r in reqs]
        sampling = RowSampling.build(params, out.logits.shape[-1], dev)
        tokens, log_probs = sample_next_tokens(last_logits, sampling, self.generator)

        m = len(reqs)
        new_rows = {
            "next_token": tokens,
            "position": lens_t,
            "write_col": torch.full((m,), width, dtype=torch.long, device=dev),
            "gen_len": torch.zeros(m, dtype=torch.long, device=dev),
            "max_tokens": torch.tensor([p.max_tokens for p in params], device=dev),
            "stop_ids": self._stop_table(params),
            "alive": torch.ones(m, dtype=torch.bool, device=dev),
        }
        self._append_rows(new_rows, sampling, reqs)
        self.kv_len = max(self.kv_len, width + 1)
        self._record(r0, tokens, log_probs)

    def _prefill_inputs(self, prompts: list[list[int]], width: int):
        """Left-padded ids, RoPE positions and the additive (B, 1, width, width) causal+padding mask."""
        dev = self.device
        ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in prompts], device=dev)
        start = width - torch.tensor([len(p) for p in prompts], device=dev)
        cols = torch.arange(width, device=dev)
        position_ids = (cols[None, :] - start[:, None]).clamp(min=0)
        # Causal and not padding; padded query rows may see themselves so no softmax row is empty (NaN).
        allowed = (cols[None, None, :] <= cols[None, :, None]) & (cols[None, None, :] >= start[:, None, None])
        allowed |= torch.eye(width, dtype=torch.bool, device=dev)
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=dev).masked_fill_(~allowed, float("-inf"))
        return ids, position_ids, mask[:, None]

    def _stop_table(self, params: list[SamplingParams]) -> torch.Tensor:
        """(m, S) stop ids per row padded with -1 (never a token); ignore_eos rows get none."""
        stops = [() if p.ignore_eos else p.stop_token_ids for p in params]
        width = max(1, max(len(s) for s in stops))
        return torch.tensor([list(s) + [-1] * (width - len(s)) for s in stops], dtype=torch.long, device=self.device)

    def _append_rows(self, new: dict[str, torch.Tensor], sampling: RowSampling, reqs) -> None:
        if not self.reqs:
            self.rows, self.sampling = new, sampling
        else:
            old_stop, new_stop = self.rows["stop_ids"], new["stop_ids"]
            width = max(old_stop.shape[1], new_stop.shape[1])
            pad = lambda t: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=-1)  # noqa: E731
            self.rows = {k: torch.cat([self.rows[k], new[k]]) for k in new if k != "stop_ids"}
            self.rows["stop_ids"] = torch.cat([pad(old_stop), pad(new_stop)])
            self.sampling = RowSampling.cat([self.sampling, sampling])
        self.reqs.extend(reqs)

    # ------------------------------------------------------------------ decode
    def _decode(self) -> None:
        rows, cache = self.rows, self.cache
        mask = cache.begin_decode(rows["write_col"], self.kv_len)
        try:
            if self.fast is not None and self.fast.usable():
                logits = self.fast.step(rows["next_token"], rows["position"], cache, mask)
            else:
                logits = self.model(input_ids=rows["next_token"][:, None], attention_mask=mask,
                                    position_ids=rows["position"][:, None], past_key_values=cache,
                                    use_cache=True).logits[:, -1]
        finally:
            cache.end()
        tokens, log_probs = sample_next_tokens(logits, self.sampling, self.generator)
        step = rows["alive"].long()
        rows["write_col"] += step
        rows["position"] += step
        rows["next_token"] = tokens
        self.kv_len = min(self.kv_len + 1, cache.capacity)
        self._record(0, tokens, log_probs)

    def _record(self, r0: int, tokens: torch.Tensor, log_probs: torch.Tensor) -> None:
        """Store the new tokens of rows ``[r0, r0+len(tokens))`` and retire rows that just finished."""
        r1 = r0 + tokens.shape[0]
        rows = self.rows
        alive, gen_len = rows["alive"][r0:r1], rows["gen_len"][r0:r1]
        row_idx = torch.arange(r0, r1, device=self.device)
        col = gen_len.clamp(max=self.out_tokens.shape[1] - 1)  # dead rows rewrite a slot already read out
        self.out_tokens[row_idx, col] = tokens
        self.out_log_probs[row_idx, col] = log_probs
        gen_len += alive.long()
        stopped = (rows["stop_ids"][r0:r1] == tokens[:, None]).any(dim=-1)
        done = alive & (stopped | (gen_len >= rows["max_tokens"][r0:r1]))
        if bool(done.any()):
            self._finish((done.nonzero().flatten() + r0).tolist(), stopped[done].tolist())

    def _finish(self, finished: list[int], stopped: list[bool]) -> None:
        idx = torch.tensor(finished, device=self.device)
        lengths = self.rows["gen_len"][idx].tolist()
        tokens = self.out_tokens[idx].tolist()
        log_probs = self.out_log_probs[idx].tolist()
        self.rows["alive"][idx] = False
        results = []
        for i, row in enumerate(finished):
            req, n = self.reqs[row], lengths[i]
            self.reqs[row] = None
            lp = log_probs[i][:n] if req.params.logprobs else None
            results.append((req, TokenOutput(req.request_id, tokens[i][:n], lp, "stop" if stopped[i] else "length")))
        self.n_dead += len(finished)
        if self.n_dead == len(self.reqs):
            self._reset_rows()
        elif self.n_dead * 4 >= len(self.reqs):
            self._compact()
        for req, output in results:  # after the state is consistent: a callback may submit new work
            req.on_done(output)

    def _compact(self) -> None:
        """Drop finished rows from the decode batch (KV rows, masks, outputs, per-row state)."""
        keep = self.rows["alive"].nonzero().flatten()
        self.cache.keep_rows(keep, self.kv_len)
        k = keep.shape[0]
        self.out_tokens[:k] = self.out_tokens[keep]
        self.out_log_probs[:k] = self.out_log_probs[keep]
        self.rows = {name: t[keep] for name, t in self.rows.items()}
        self.sampling = self.sampling.select(keep)
        self.reqs = [self.reqs[i] for i in keep.tolist()]
        self.n_dead = 0
        self.kv_len = int(self.rows["write_col"].max()) + 1
