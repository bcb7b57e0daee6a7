"""Continuous batching over an in-process HF causal LM: prefill new requests, decode live rows.

Each :meth:`ContinuousBatcher.step` admits waiting requests into rows (batched prefill forwards, see
:mod:`~hybridflow.rollout.hf.prefill`), then runs one decode forward for every live row.  Rows that finish
hand their result back at once and leave the batch (their cache rows are compacted away lazily, when
enough are dead or new requests arrive), so short responses never wait for long ones -- the
"iteration-level scheduling" of Orca (Yu et al., OSDI 2022) that vLLM and SGLang also use.

The KV cache holds the rows and columns in flight, not a preallocated maximum: it grows (rows and
columns) when requests need more, bounded by ``max_num_seqs`` rows, ``max_model_len`` columns and, on
CUDA, ``gpu_memory_utilization`` of the memory left free by everything else.  With
``enable_prefix_caching`` finished rows stay parked in free cache rows (:mod:`~hybridflow.rollout.hf.prefix_pool`)
until a later prompt extends them or the rows are needed (least recently used first).

Per decode step the Python work is O(1) in the batch size: every per-row quantity (next token, write
column = position, generated length, budget, stop ids, sampling params) is a tensor, the attention mask is
a row mask updated in place, and the only host sync is one ``any()`` to learn whether some row finished.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading

import torch

from hybridflow.engine.transformers_adapter import (
    attention_mask_layout,
    check_cache_object,
    forward_with_cache,
    text_config,
)
from hybridflow.rollout.base import TokenOutput, engine_failure
from hybridflow.rollout.hf.attention_masks import EngineMasks
from hybridflow.rollout.hf.exact import exact_next_tokens
from hybridflow.rollout.hf.fast_decode import fast_decoder_for
from hybridflow.rollout.hf.prefill import PrefillJob, group_prefill_jobs, run_prefill
from hybridflow.rollout.hf.kv_cache import KVGeometry, SlotKVCache, cache_columns, plan_row_moves
from hybridflow.rollout.hf.prefix_pool import ParkedSequence, PrefixPool
from hybridflow.rollout.hf.requests import BatcherLimits, GenerationRequest
from hybridflow.rollout.hf.weights_stamp import WeightsStamp
from hybridflow.rollout.hf.token_sampler import RowSampling, sample_next_tokens
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["BatcherLimits", "ContinuousBatcher", "GenerationRequest"]

logger = logging.getLogger(__name__)

_COLUMN_QUANTUM = 64  # output widths are rounded up so that growth is rare (cache widths: kv_cache.cache_columns)
_ROW_QUANTUM = 8
_MAX_MODEL_LEN_KEY = "actor_rollout_ref.rollout.max_model_len"
_REPORTED: set[tuple[str, str]] = set()  # (model type, reason) already reported in this process


def _report_fallback(model: torch.nn.Module, reason: str) -> None:
    """Say once per process and model type why decode steps run through ``model.forward``."""
    key = (str(getattr(model.config, "model_type", type(model).__name__)), reason)
    if key in _REPORTED:
        return
    _REPORTED.add(key)
    logger.warning("hf rollout: the %s model decodes through model.forward (same results, slower per step) instead "
                   "of the fast decode step: %s", key[0], reason)


def _round_up(x: int, quantum: int = _COLUMN_QUANTUM) -> int:
    return -(-x // quantum) * quantum


class ContinuousBatcher:
    """Owns the decode batch and KV cache of one model; not thread-safe by itself (callers hold ``lock``)."""

    def __init__(self, model: torch.nn.Module, pad_token_id: int, generator: torch.Generator,
                 limits: BatcherLimits = BatcherLimits(), compute_dtype: torch.dtype | None = None,
                 fast_decode: bool = True, suppress_ids: list[int] | None = None, name: str = "hf",
                 exact: bool = False):
        self.model = model
        self.name = name
        # exact on-policy log-probs (rollout/hf/exact.py): every distribution from a full forward, as the actor's
        self.exact = bool(exact)
        if self.exact:
            fast_decode = False
        self.doing = "idle"  # what the step under way does: read by the stall watchdog (engine.progress)
        # Decode steps skip transformers' forward plumbing when the model has the supported structure.
        self.masks = EngineMasks(attention_mask_layout(model.config))  # refuses layers it cannot mask
        self.fast, self.fast_reason = fast_decoder_for(model) if fast_decode else (None, "disabled")
        if self.fast is None and fast_decode:
            _report_fallback(model, self.fast_reason)
        self.pad_token_id = int(pad_token_id)
        self.limits = limits
        self.generator = generator
        first = next(model.parameters())
        self.device, self.param_dtype = first.device, first.dtype
        self.compute_dtype = compute_dtype or self.param_dtype
        lm_config = text_config(model.config)
        self.geometry = KVGeometry.from_config(lm_config, self.compute_dtype)
        model_len = getattr(lm_config, "max_position_embeddings", None)
        self.max_model_len = limits.max_model_len or (int(model_len) if model_len else None)
        # never sampled (a VLM's image/video placeholders: the response cannot carry pixels for them)
        self.suppress = torch.tensor(suppress_ids, device=self.device) if suppress_ids else None
        self.lock = threading.Lock()
        self.pending: collections.deque[GenerationRequest] = collections.deque()
        self.cache: SlotKVCache | None = None
        # exact mode never reads the cache for logits: nothing to gain from parking prefixes
        self.pool = PrefixPool() if limits.enable_prefix_caching and not self.exact else None
        self._pool_stamp: int | None = None
        self.stamp = WeightsStamp(model)  # tells when the weights changed under parked prefixes
        self.counters: collections.Counter[str] = collections.Counter()
        self.out_tokens = torch.empty(0)
        self.out_log_probs = torch.empty(0)
        self._reset_rows()

    # ------------------------------------------------------------------ public
    def submit(self, req: GenerationRequest) -> None:
        self.check(req)
        self.pending.append(req)

    def check(self, req: GenerationRequest) -> None:
        """Raise ``ValueError`` (naming the setting to change) for a request the engine cannot serve."""
        if not req.prompt_ids:
            raise ValueError(f"request {req.request_id}: prompt_ids is empty; a prompt needs at least one token")
        if self.exact and req.vision is not None:
            raise ValueError(f"request {req.request_id}: actor_rollout_ref.rollout.exact_log_probs=true computes every "
                             "distribution from the token ids alone; image prompts are not supported in exact mode "
                             "(set exact_log_probs=false for a vision-language model)")
        if req.params.n != 1:
            raise ValueError(
                f"request {req.request_id}: engines take n=1 requests (got n={req.params.n}); "
                "submit the prompt n times, as generate_sequences does"
            )
        total = len(req.prompt_ids) + req.params.max_tokens
        if self.max_model_len is not None and total > self.max_model_len:
            source = (f"{_MAX_MODEL_LEN_KEY}={self.max_model_len}" if self.limits.max_model_len
                      else f"the model's max_position_embeddings={self.max_model_len} ({_MAX_MODEL_LEN_KEY} unset)")
            raise ValueError(
                f"request {req.request_id}: {len(req.prompt_ids)} prompt tokens + max_tokens="
                f"{req.params.max_tokens} = {total} tokens exceed {source}; raise {_MAX_MODEL_LEN_KEY} or "
                "shorten the prompt / response budget"
            )

    def has_work(self) -> bool:
        return bool(self.pending) or bool(self.reqs)

    def step(self) -> None:
        """Admit waiting requests, then decode one token for every live row.

        Whatever raises inside (a forward, the sampler, non-finite logits) is handed, as an
        :class:`~hybridflow.rollout.base.EngineError` naming this step's phase and carrying the original
        traceback, to every request in flight or waiting -- and raised."""
        self.stamp.new_step()
        with torch.inference_mode(), self._autocast():
            try:
                self._admit()
                if self.reqs:
                    self.doing = "decode"
                    self._decode()
            except BaseException as exc:
                error = engine_failure(exc, self.name, self.doing, self.load())
                self.fail_all(error)
                raise error
            finally:
                self.doing = "idle"

    def load(self) -> int:
        """Requests in flight or waiting."""
        return len(self.reqs) - self.n_dead + len(self.pending)

    def progress(self) -> int:
        """Forwards run so far (prefill and decode): grows while the batcher makes progress."""
        return self.counters["prefill_forwards"] + self.counters["decode_steps"]

    def fail_all(self, exc: BaseException) -> None:
        """Hand ``exc`` to every request in flight or waiting, and start over with an empty batch."""
        victims = [r for r in self.reqs if r is not None] + list(self.pending)
        self.pending.clear()
        self._reset_rows()
        self.drop_prefixes()  # a forward failed half-way: what the rows hold is not trusted
        for req in victims:
            try:
                req.on_error(exc)
            except Exception:  # noqa: BLE001 - one caller gone (its event loop closed) must not spare the others
                logger.warning("request %s: its error callback failed", req.request_id, exc_info=True)

    def abort_all(self) -> int:
        """Finish every request now with ``finish_reason="abort"`` and what it generated so far (waiting
        requests with nothing); returns how many were aborted.  The batcher stays usable."""
        n = 0
        if self.reqs:
            live = [i for i, r in enumerate(self.reqs) if r is not None]
            n += len(live)
            with torch.inference_mode():
                self._finish(live, ["abort"] * len(live))
        while self.pending:
            req = self.pending.popleft()
            n += 1
            req.on_done(TokenOutput(req.request_id, [], [] if req.params.logprobs else None, "abort"))
        self.counters["aborted"] += n
        return n

    def drop_prefixes(self) -> int:
        """Forget every parked prefix (their K/V belong to weights that are about to change)."""
        return self.pool.clear() if self.pool is not None else 0

    def release_cache(self) -> None:
        if self.has_work():
            raise RuntimeError("cannot release the KV cache while requests are in flight; abort_all() first")
        self.drop_prefixes()
        self.cache = None
        self.out_tokens = self.out_log_probs = torch.empty(0)

    def stats(self) -> dict[str, int]:
        cache = self.cache
        return {
            **{k: self.counters[k] for k in ("requests", "prompt_tokens", "prefill_tokens", "prefix_reused_tokens",
                                              "shared_prefill_tokens", "prefix_hits", "prefill_forwards",
                                              "generated_tokens", "decode_steps", "parked", "evicted", "aborted")},
            "parked_rows": len(self.pool) if self.pool is not None else 0,
            "kv_cache_rows": cache.max_rows if cache is not None else 0,
            "kv_cache_columns": cache.capacity if cache is not None else 0,
            "kv_cache_bytes": cache.memory_bytes() if cache is not None else 0,
        }

    # ------------------------------------------------------------------ batch state
    def _autocast(self):
        if self.compute_dtype == self.param_dtype:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.compute_dtype)

    def _reset_rows(self) -> None:
        self.reqs: list[GenerationRequest | None] = []  # per row; None = finished, awaiting compaction
        self.need_cols: list[int] = []  # per row: prompt + max_tokens
        self.rows: dict[str, torch.Tensor] = {}
        self.sampling: RowSampling | None = None
        self.kv_len = 0  # columns the next decode forward attends over (>= max write column + 1)
        self.n_dead = 0

    # ------------------------------------------------------------------ memory
    def _bytes_per_token(self) -> int | None:
        if self.cache is not None and self.cache.bytes_per_token():
            return self.cache.bytes_per_token()
        return self.geometry.bytes_per_token if self.geometry is not None else None

    def _budget_bytes(self) -> int | None:
        """CUDA: ``gpu_memory_utilization`` x (device memory free + what the cache already holds + what
        torch's allocator has cached but not handed out).  None (no bound) elsewhere."""
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        idle = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        own = self.cache.memory_bytes() if self.cache is not None else 0
        return int(self.limits.gpu_memory_utilization * (free + idle + own))

    def _row_limit(self, cols: int, budget: int | None) -> int:
        limit = self.limits.max_num_seqs
        per_token = self._bytes_per_token()
        if budget is not None and per_token:
            limit = min(limit, budget // (cache_columns(cols) * per_token))
        return limit

    # ------------------------------------------------------------------ admission
    def _admit(self) -> None:
        if not self.pending:
            return
        self.doing = "admission"
        if self.pool is not None and len(self.pool) and self.stamp.value() != self._pool_stamp:
            self.drop_prefixes()  # the weights changed since these rows were computed
        live = len(self.reqs) - self.n_dead
        room = self.limits.max_num_seqs - live
        if room <= 0:
            return
        cols = max((n for n, r in zip(self.need_cols, self.reqs) if r is not None), default=0)
        cache = self.cache
        budget: list[int | None] = []  # computed at most once, and only when the cache has to grow
        chosen: list[GenerationRequest] = []
        while self.pending and len(chosen) < room:
            req = self.pending[0]
            need = max(cols, len(req.prompt_ids) + req.params.max_tokens)
            rows = live + len(chosen) + 1
            if cache is None or rows > cache.max_rows or need > cache.capacity:
                if not budget:
                    budget.append(self._budget_bytes())
                if rows > self._row_limit(need, budget[0]):
                    if rows == 1:
                        self.pending.popleft()
                        req.on_error(MemoryError(
                            f"request {req.request_id}: one KV-cache row of {cache_columns(need)} columns does not fit "
                            f"in gpu_memory_utilization={self.limits.gpu_memory_utilization} of the free device "
                            f"memory; raise actor_rollout_ref.rollout.gpu_memory_utilization or lower "
                            f"{_MAX_MODEL_LEN_KEY} / the response length"))
                        continue
                    break  # wait for rows to free up
            chosen.append(self.pending.popleft())
            cols = need
        if chosen:
            try:
                self._start(chosen, cols, budget[0] if budget else None)
            except BaseException:
                # requests that did not get a row yet go back to the queue, where fail_all finds them
                placed = {id(r) for r in self.reqs if r is not None}
                self.pending.extendleft(reversed([r for r in chosen if id(r) not in placed]))
                raise

    def _start(self, reqs: list[GenerationRequest], cols: int, budget: int | None) -> None:
        """Give ``reqs`` rows, prefill them (reusing parked prefixes; identical prompts share one prefill, see
        :func:`~hybridflow.rollout.hf.prefill.group_prefill_jobs`) and sample their first tokens."""
        jobs, job_of = group_prefill_jobs(reqs)
        takeovers = self._claim_parked_prefixes(jobs)
        k = self._layout(len(reqs), cols, budget, takeovers)
        for job in jobs:
            job.rows = [k + i for i in job.members]
        for entry, _ in takeovers:
            self.pool.remove(entry)
        self.counters["prefix_hits"] += len(takeovers)
        self.doing = f"prefill of {len(reqs)} request(s)"
        logits, forwards = run_prefill(self.model, self.cache, jobs, self.pad_token_id,
                                       self.limits.max_num_batched_tokens, self.param_dtype, self.device, self.masks)
        dev = self.device
        m, lens = len(reqs), [len(r.prompt_ids) for r in reqs]
        lens_t = torch.tensor(lens, device=dev)
        self.cache.set_valid_prefix(torch.arange(k, k + m, device=dev), lens_t)
        params = [r.params for r in reqs]
        row_logits = logits[torch.tensor(job_of, device=dev)]
        sampling = RowSampling.build(params, row_logits.shape[-1], dev)
        zeros = torch.zeros(m, dtype=torch.long, device=dev)
        if self.exact:
            tokens, log_probs = exact_next_tokens(self.model, [list(r.prompt_ids) for r in reqs], params, sampling,
                                                  self.generator, zeros, self.suppress, self.pad_token_id)
        else:
            tokens, log_probs = sample_next_tokens(row_logits, sampling, self.generator, zeros, self.suppress)
        self._count_prefill(reqs, jobs, forwards)
        new_rows = {
            "next_token": tokens,
            "write_col": lens_t,  # column = index in the sequence: rows start at column 0, no padding
            # rotary position of column c is c + rope_delta (non-zero after images: M-RoPE, see hf_vision.py)
            "rope_delta": torch.tensor([r.vision.rope_delta if r.vision is not None else 0 for r in reqs], device=dev),
            "gen_len": zeros.clone(),
            "max_tokens": torch.tensor([p.max_tokens for p in params], device=dev),
            "stop_ids": self._stop_table(params),
            "alive": torch.ones(m, dtype=torch.bool, device=dev),
        }
        self._append_rows(new_rows, sampling, reqs)
        self.kv_len = max(self.kv_len, max(lens) + 1)
        self._record(k, tokens, log_probs)

    def _claim_parked_prefixes(self, jobs: list[PrefillJob]) -> list[tuple[ParkedSequence, list[int]]]:
        """Parked rows whose tokens start a job's prompt, pinned for the job (its ``start`` set past them): each
        becomes the job's new rows (several jobs may share one parked row: it is then copied)."""
        takeovers: list[tuple[ParkedSequence, list[int]]] = []
        if self.pool is None or not len(self.pool):
            return takeovers
        for job in jobs:
            if job.vision is not None:  # parked K/V hold no pixels' identity: image prompts prefill whole
                continue
            entry, reuse = self.pool.lookup(job.prompt)
            if entry is not None and reuse > 0:
                entry.pinned, job.start = True, reuse
                takeovers.append((entry, job.members))
        return takeovers

    def _count_prefill(self, reqs: list[GenerationRequest], jobs: list[PrefillJob], forwards: int) -> None:
        c = self.counters
        c["requests"] += len(reqs)
        c["prompt_tokens"] += sum(len(r.prompt_ids) for r in reqs)
        c["prefill_forwards"] += forwards
        for job in jobs:
            c["prefill_tokens"] += len(job.prompt) - job.start
            c["prefix_reused_tokens"] += job.start
            c["shared_prefill_tokens"] += (len(job.members) - 1) * len(job.prompt)

    def _layout(self, extra_rows: int, cols: int, budget: int | None,
                takeovers: list[tuple[ParkedSequence, list[int]]] = ()) -> int:
        """Make room for ``extra_rows`` new decode rows of up to ``cols`` columns; return the first new row.

        Dead rows are compacted away (live rows move to the front, in order), parked rows move out of the
        decode region, and the cache is reallocated (rows and/or columns) when the decode rows do not fit.
        A parked row in ``takeovers`` becomes the new rows listed with it (offsets among the new rows): its
        columns move (or are copied, when several rows share it) there instead of staying parked.  All
        row moves happen in one gather / scatter per layer.  Parked rows never make the cache grow: they
        keep the rows left over, least recently used evicted first.
        """
        keep = self.rows["alive"].nonzero().flatten() if self.n_dead else None
        k = keep.shape[0] if keep is not None else len(self.reqs)
        n_decode = k + extra_rows
        realloc, new_rows, new_cols = self._cache_shape(n_decode, cols, budget)
        entries = self._parked_rows_kept(n_decode, new_rows, takeovers)
        live = keep.tolist() if keep is not None else list(range(k))
        cur_rows = self.cache.max_rows if self.cache is not None else 0
        moves, targets = plan_row_moves(live, [(e.row, members) for e, members in takeovers],
                                        [e.row for e in entries], n_decode, cur_rows, realloc)
        width = max([self.kv_len] + [len(e.tokens) for e in entries] + [len(e.tokens) for e, _ in takeovers])
        self._move_cache_rows(moves, width, new_rows, new_cols, realloc)
        for e, t in zip(entries, targets):
            e.row = t
        if realloc:
            self._resize_outputs(new_rows, keep)
        if keep is not None:
            self._compact_rows(keep, outputs_moved=realloc)
        return k

    def _cache_shape(self, n_decode: int, cols: int, budget: int | None) -> tuple[bool, int, int]:
        """(reallocate, rows, columns) of a cache for ``n_decode`` decode rows of up to ``cols`` columns: the cache
        as it is when they fit, else grown by half (rows) within the memory budget."""
        cache = self.cache
        cur_rows, cur_cols = (cache.max_rows, cache.capacity) if cache is not None else (0, 0)
        new_cols = cur_cols if cols <= cur_cols else cache_columns(cols)
        if cache is not None and new_cols == cur_cols and n_decode <= cur_rows:
            return False, cur_rows, cur_cols
        limit = self._row_limit(new_cols, self._budget_bytes() if budget is None else budget)
        grown = max(_round_up(n_decode, _ROW_QUANTUM), cur_rows * 3 // 2 if n_decode > cur_rows else cur_rows)
        return True, max(n_decode, min(grown, limit)), new_cols

    def _parked_rows_kept(self, n_decode: int, rows: int,
                          takeovers: list[tuple[ParkedSequence, list[int]]]) -> list[ParkedSequence]:
        """The parked rows that stay parked (not taken over by new requests) in the ``rows - n_decode`` rows left
        after the decode region; the least recently used are evicted until they fit."""
        if self.pool is None:
            return []
        taken = {id(e) for e, _ in takeovers}  # they become decode rows: no parked row of their own
        entries = [e for e in self.pool.entries() if id(e) not in taken]
        if n_decode + len(entries) > rows:
            for e in self.pool.lru()[: n_decode + len(entries) - rows]:
                self.pool.remove(e)
                self.counters["evicted"] += 1
            entries = [e for e in self.pool.entries() if id(e) not in taken]
        return entries

    def _move_cache_rows(self, moves: list[tuple[int, int]], width: int, rows: int, cols: int, realloc: bool) -> None:
        """Apply ``moves`` (source row, destination row) to the first ``width`` columns: in place, or while
        reallocating the cache to ``rows`` x ``cols`` (allocating it the first time)."""
        src = torch.tensor([s for s, _ in moves], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in moves], dtype=torch.long, device=self.device)
        if self.cache is None:  # checked before it is kept: a refused cache leaves the batcher as it was
            fresh = SlotKVCache(rows, cols, self.compute_dtype, self.param_dtype, self.device)
            check_cache_object(fresh)
            self.cache = fresh
        elif realloc:
            self.cache = self.cache.resized(rows, cols, src, dst, width)
        elif moves:
            self.cache.move_rows(src, dst, width)

    def _compact_rows(self, keep: torch.Tensor, outputs_moved: bool) -> None:
        """Drop finished rows from the decode state (per-row tensors, sampling, outputs)."""
        k = keep.shape[0]
        if not outputs_moved:
            self.out_tokens[:k] = self.out_tokens[keep]
            self.out_log_probs[:k] = self.out_log_probs[keep]
        kept = keep.tolist()
        if k == 0:
            self._reset_rows()
            return
        self.rows = {name: t[keep] for name, t in self.rows.items()}
        self.sampling = self.sampling.select(keep)
        self.reqs = [self.reqs[i] for i in kept]
        self.need_cols = [self.need_cols[i] for i in kept]
        self.n_dead = 0
        self.kv_len = int(self.rows["write_col"].max()) + 1

    def _resize_outputs(self, rows: int, keep: torch.Tensor | None) -> None:
        """Output buffers with ``rows`` rows; live rows move to the front like the cache rows."""
        width = self.out_tokens.shape[1] if self.out_tokens.dim() == 2 else _COLUMN_QUANTUM
        tokens = torch.zeros(rows, width, dtype=torch.long, device=self.device)
        log_probs = torch.zeros(rows, width, dtype=torch.float32, device=self.device)
        if self.out_tokens.dim() == 2 and self.reqs:
            src = keep if keep is not None else torch.arange(len(self.reqs), device=self.device)
            tokens[: src.shape[0]] = self.out_tokens[src]
            log_probs[: src.shape[0]] = self.out_log_probs[src]
        self.out_tokens, self.out_log_probs = tokens, log_probs

    def _ensure_output_width(self, width: int) -> None:
        if width > self.out_tokens.shape[1]:
            pad = _round_up(width) - self.out_tokens.shape[1]
            self.out_tokens = torch.nn.functional.pad(self.out_tokens, (0, pad))
            self.out_log_probs = torch.nn.functional.pad(self.out_log_probs, (0, pad))

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
        self.need_cols.extend(len(r.prompt_ids) + r.params.max_tokens for r in reqs)
        self._ensure_output_width(max(r.params.max_tokens for r in reqs))

    # ------------------------------------------------------------------ decode
    def _exact_decode(self) -> None:
        rows = self.rows
        alive, gen_len = rows["alive"].tolist(), rows["gen_len"].tolist()
        sequences = [None if req is None or not alive[i]
                     else list(req.prompt_ids) + self.out_tokens[i, :gen_len[i]].tolist()
                     for i, req in enumerate(self.reqs)]
        self.doing = f"exact decode of {sum(alive)} row(s)"
        params = [r.params if r is not None else None for r in self.reqs]
        tokens, log_probs = exact_next_tokens(self.model, sequences, params, self.sampling, self.generator,
                                              rows["gen_len"], self.suppress, self.pad_token_id)
        rows["write_col"] += rows["alive"]
        rows["next_token"] = tokens
        self.kv_len = min(self.kv_len + 1, self.cache.capacity)
        self.counters["decode_steps"] += 1
        self._record(0, tokens, log_probs)

    def _decode(self) -> None:
        if self.exact:
            return self._exact_decode()
        rows, cache = self.rows, self.cache
        mask = self.masks.decode(cache.begin_decode(rows["write_col"], self.kv_len), rows["write_col"])
        positions = rows["write_col"] + rows["rope_delta"]
        try:
            if self.fast is not None and self.fast.usable():
                # the fingerprint reads weight values (a host sync on CUDA): only when packed copies need it
                stamp = self.stamp.value() if self.fast.packed.enabled else None
                logits = self.fast.step(rows["next_token"], positions, cache, mask, stamp)
            else:
                logits = forward_with_cache(self.model, cache, input_ids=rows["next_token"][:, None],
                                            attention_mask=mask, position_ids=positions[:, None],
                                            use_cache=True).logits[:, -1]
        finally:
            cache.end()
        tokens, log_probs = sample_next_tokens(logits, self.sampling, self.generator, rows["gen_len"], self.suppress)
        rows["write_col"] += rows["alive"]
        rows["next_token"] = tokens
        self.kv_len = min(self.kv_len + 1, cache.capacity)
        self.counters["decode_steps"] += 1
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
        gen_len += alive
        stopped = (rows["stop_ids"][r0:r1] == tokens[:, None]).any(dim=-1)
        done = alive & (stopped | (gen_len >= rows["max_tokens"][r0:r1]))
        broken = alive & ~torch.isfinite(log_probs)  # NaN / inf logits give a non-finite log-prob
        any_done, any_broken = torch.stack((done.any(), broken.any())).tolist()  # the step's one host sync
        if any_broken:
            self._non_finite(r0, broken)
        if any_done:
            reasons = ["stop" if s else "length" for s in stopped[done].tolist()]
            self._finish((done.nonzero().flatten() + r0).tolist(), reasons)

    def _non_finite(self, r0: int, broken: torch.Tensor) -> None:
        rows = (broken.nonzero().flatten() + r0).tolist()
        ids = [self.reqs[r].request_id for r in rows[:3]]
        raise FloatingPointError(
            f"the model produced non-finite logits (NaN or inf) for {len(rows)} of {len(broken)} row(s) "
            f"(requests {', '.join(ids)}{', ...' if len(rows) > 3 else ''}): the policy's "
            "weights have most likely diverged (look at actor/grad_norm and actor/pg_loss of the last steps; lower "
            "actor_rollout_ref.actor.optim.lr), or the rollout dtype overflows (actor_rollout_ref.rollout.dtype)")

    def _finish(self, finished: list[int], reasons: list[str]) -> None:
        idx = torch.tensor(finished, device=self.device)
        lengths = self.rows["gen_len"][idx].tolist()
        tokens = self.out_tokens[idx].tolist()
        log_probs = self.out_log_probs[idx].tolist()
        self.rows["alive"][idx] = False
        park = self.pool is not None
        if park:
            stamp = self.stamp.value()
            if stamp != self._pool_stamp:
                self.drop_prefixes()
                self._pool_stamp = stamp
        results = []
        for i, row in enumerate(finished):
            req, n = self.reqs[row], lengths[i]
            self.reqs[row] = None
            lp = log_probs[i][:n] if req.params.logprobs else None
            results.append((req, TokenOutput(req.request_id, tokens[i][:n], lp, reasons[i])))
            if park and n and req.vision is None:  # the row holds the K/V of the prompt and of every generated token but the last
                self.pool.park(tuple(req.prompt_ids) + tuple(tokens[i][: n - 1]), row)
                self.counters["parked"] += 1
            self.counters["generated_tokens"] += n
        self.n_dead += len(finished)
        if self.n_dead == len(self.reqs):
            self._reset_rows()  # parked rows stay where they are: nothing decodes over them any more
        elif self.n_dead * 4 >= len(self.reqs):
            self._layout(0, self.cache.capacity, None)
        for req, output in results:  # after the state is consistent: a callback may submit new work
            req.on_done(output)
