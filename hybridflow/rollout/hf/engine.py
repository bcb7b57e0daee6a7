"""The ``hf`` rollout engine: an in-process transformers causal LM behind the async engine interface.

It is the CPU / debugging engine and the colocated hybrid engine of small runs: it generates with the
very module the actor trains (no second copy of the weights, nothing to sync), so ``update_weights`` only
copies tensors that are not already the engine's own.  With FSDP2 the caller unshards the module (e.g.
``FSDPModule.unshard()``) around generation; the engine itself never touches sharding.

Concurrency model: :meth:`HFRolloutEngine.generate` enqueues a request and awaits its future; one driver
task per event loop runs :class:`~hybridflow.rollout.hf.batcher.ContinuousBatcher` steps in a worker thread,
so all requests in flight share each decode forward and the event loop stays free for agent-loop I/O.
:meth:`HFRolloutEngine.generate_batch` runs the same steps directly in the calling thread.

Attention must go through ``sdpa`` or ``eager`` (both take the engine's explicit 4-D masks);
FlashAttention-2 does not accept such masks and is rejected with a clear error.

Vision-language models (Qwen2-VL family): a request's ``multi_modal_data`` (``{"image": [PIL images]}``) goes
through the checkpoint's image processor (``processor=``) and the prefill forward with the pixel inputs and
M-RoPE positions; decoding continues at transformers' ``rope_deltas`` offset (:mod:`~hybridflow.rollout.hf.vision`).
Image prompts are prefilled whole: no prefix reuse and no chunking for them (text requests keep both).
A vision-language model never samples the image/video placeholder tokens (the response has no pixels for
them, and the actor's forward would refuse them); reported log-probs stay over the full vocabulary.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Iterable, Sequence

import torch

from hybridflow.engine.device import empty_cache, resolve_dtype
from hybridflow.engine.forward import eval_mode
from hybridflow.engine.transformers_adapter import attention_implementation
from hybridflow.rollout.base import EngineError, RolloutEngine, TokenOutput, _per_request, engine_failure
from hybridflow.rollout.hf.batcher import BatcherLimits, ContinuousBatcher, GenerationRequest
from hybridflow.rollout.hf.vision import VisionPreparer
from hybridflow.rollout.multi_modal import images_of
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.utils.registry import closest
from hybridflow.utils.threads import DaemonExecutor, LoopPoster

__all__ = ["HFRolloutEngine", "rollout_compute_dtype"]

_SUPPORTED_ATTENTION = ("sdpa", "eager")
_ABORT_WAIT_S = 120.0  # abort_all waits this long at most for the step under way


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def rollout_compute_dtype(dtype: str | torch.dtype | None, device: torch.device,
                          param_dtype: torch.dtype = torch.float32) -> torch.dtype:
    """The dtype the ``hf`` rollout computes in for verl's ``rollout.dtype`` on ``device``.

    * CUDA: ``dtype`` (``bfloat16`` by default) -- autocast over the shared fp32 master weights, K/V cached
      in that dtype.  It must be the actor's compute dtype (``actor.fsdp_config.dtype``) wherever the
      rollout's log-probs stand in for pi_old; ``config/checks/machine.check_rollout_precision`` refuses a mismatch.
    * CPU: the weights' dtype (fp32), whatever ``dtype`` says -- as the actor, which computes in fp32 on CPU.
      Measured on this project's CPU (2 cores, avx512_bf16, Qwen2 ``medium`` 20M, 32 x 32 tokens): bf16
      autocast decodes no faster (9.8-11.6 vs 9.9-10.7 CPU-s) and moves the sampled tokens' log-probs by
      3.6e-3 nats on average (max 1.5e-2) from the fp32 forward that trains on them.
    * ``None``: the weights' dtype.
    """
    if dtype is None or device.type != "cuda":
        return param_dtype
    resolved = resolve_dtype(dtype, "actor_rollout_ref.rollout.dtype")
    if torch.finfo(resolved).bits > torch.finfo(param_dtype).bits:
        raise ValueError(f"actor_rollout_ref.rollout.dtype={dtype}: the model's weights are {param_dtype}; the "
                         "rollout can compute in a lower precision than its weights (autocast), not a higher one")
    return resolved


def _check_attention(model: torch.nn.Module) -> None:
    attn = attention_implementation(model.config)
    if attn not in _SUPPORTED_ATTENTION:
        raise ValueError(
            f"hf rollout engine needs attn_implementation in {_SUPPORTED_ATTENTION}, the model uses '{attn}'; "
            "load it with attn_implementation='sdpa'"
        )


def _special_token_ids(model: torch.nn.Module, tokenizer, eos_token_ids, pad_token_id) -> tuple[tuple[int, ...], int]:
    """(EOS ids, pad id): the ones given, else the tokenizer's, else the model's (its generation config's EOS
    first; pad 0 when the model names none)."""
    if eos_token_ids is None:
        eos_token_ids = getattr(tokenizer, "eos_token_id", None)
    if eos_token_ids is None:
        gen_cfg = getattr(model, "generation_config", None)
        eos_token_ids = getattr(gen_cfg, "eos_token_id", None) or model.config.eos_token_id
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    return tuple(_as_id_list(eos_token_ids)), pad_token_id


class HFRolloutEngine(RolloutEngine):
    """Generate with an HF ``*ForCausalLM`` module already in memory.

    ``eos_token_ids`` (default: the tokenizer's EOS, else the model's generation config) are added to
    every request's stop set unless the request sets ``ignore_eos``.  ``pad_token_id`` only fills the
    padding of prefill forwards (it is masked out).  The other settings are verl's
    ``actor_rollout_ref.rollout`` keys:

    * ``max_num_seqs`` -- requests decoding at once, and the KV cache's row bound (parked prefixes use
      the rows left over);
    * ``max_model_len`` -- prompt + response tokens of one request (a request over it is refused with an
      error naming the key); None: the model's ``max_position_embeddings``;
    * ``max_num_batched_tokens`` -- (padded) tokens of one prefill forward; longer prompts are prefilled
      in chunks (same result);
    * ``enable_prefix_caching`` -- finished requests' KV rows stay parked, and a prompt that extends one
      (the next turn of an agent trajectory) prefills only its new tokens;
    * ``free_cache_engine`` -- :meth:`sleep` frees the KV cache (else it keeps it allocated for the next
      rollout);
    * ``gpu_memory_utilization`` -- CUDA only: the KV cache may take this share of the device memory left
      free by everything else (weights, optimizer state, other processes) when it is sized; ignored on CPU;
    * ``dtype`` -- compute dtype, see :func:`rollout_compute_dtype` (CUDA: autocast; CPU: fp32).

    ``processor``: the multimodal processor of a vision-language checkpoint (its image processor turns a
    request's images into pixel inputs); a text model needs none and refuses images.

    The cache is sized by the requests in flight (rows and columns grow on demand), never preallocated.
    ``max_batch_size`` is the former name of ``max_num_seqs``.  ``fast_decode`` runs decode steps through
    :mod:`~hybridflow.rollout.hf.fast_decode` when the model's structure allows (same results, less overhead).
    ``exact_log_probs`` (``actor_rollout_ref.rollout.exact_log_probs``): every next-token distribution comes from
    a full forward of the row with the actor's arithmetic (:mod:`~hybridflow.rollout.hf.exact`), so the
    log-probs equal the actor's recomputation bit for bit on CPU fp32; slower (no cached decode).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer=None,
        *,
        processor=None,
        eos_token_ids: int | Iterable[int] | None = None,
        pad_token_id: int | None = None,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 8192,
        enable_prefix_caching: bool = True,
        free_cache_engine: bool = True,
        gpu_memory_utilization: float = 0.5,
        dtype: str | torch.dtype | None = None,
        seed: int = 0,
        fast_decode: bool = True,
        max_batch_size: int | None = None,
        name: str = "hf",
        exact_log_probs: bool = False,
    ):
        _check_attention(model)
        self.model = model
        self.name = name
        self.eos_token_ids, pad_token_id = _special_token_ids(model, tokenizer, eos_token_ids, pad_token_id)
        first = next(model.parameters())
        self.compute_dtype = rollout_compute_dtype(dtype, first.device, first.dtype)
        limits = BatcherLimits(
            max_num_seqs=int(max_batch_size if max_batch_size is not None else max_num_seqs),
            max_model_len=None if max_model_len is None else int(max_model_len),
            max_num_batched_tokens=int(max_num_batched_tokens),
            enable_prefix_caching=bool(enable_prefix_caching),
            gpu_memory_utilization=float(gpu_memory_utilization),
        )
        self.free_cache_engine = bool(free_cache_engine)
        self.generator = torch.Generator(device=first.device)
        self.generator.manual_seed(seed)
        self._vision = VisionPreparer(processor, model.config)
        spec = self._vision.spec
        self._batcher = ContinuousBatcher(model, pad_token_id, self.generator, limits, self.compute_dtype, fast_decode,
                                          suppress_ids=[spec.image_token_id, spec.video_token_id] if spec else None,
                                          name=name, exact=exact_log_probs)
        # a daemon thread: a forward that never returns must not keep the process from exiting
        self._executor = DaemonExecutor(max_workers=1, name="hf-rollout")
        self._driver: asyncio.Task | None = None
        # per event loop: delivers results from the stepping thread (weak: run_async makes a loop per call)
        self._posters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopPoster] = weakref.WeakKeyDictionary()
        self._asleep = False
        self._abort_waiting = threading.Event()  # set while abort_all() waits for the step under way

    # ------------------------------------------------------------------ requests
    def _request(self, prompt_ids, params: SamplingParams, request_id: str, on_done, on_error,
                 multi_modal_data=None) -> GenerationRequest:
        if self._asleep:
            raise RuntimeError("hf rollout engine is asleep; call wake_up() before generating")
        if not params.ignore_eos and self.eos_token_ids:
            params = params.with_stop_tokens(self.eos_token_ids)
        ids = [int(t) for t in prompt_ids]
        vision = self._vision.prepare(request_id, ids, multi_modal_data)
        if vision is None and self._vision.spec is not None and self._vision.spec.image_token_id in ids:
            raise ValueError(f"request {request_id}: the prompt holds image tokens (id {self._vision.spec.image_token_id}) "
                             "but no images came with it; pass the images (image_data= / multi_modal_data="
                             "{'image': [...]}) that the prompt was rendered with")
        return GenerationRequest(request_id, ids, params, on_done, on_error, vision)

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams, request_id: str,
                       multi_modal_data: dict | None = None) -> TokenOutput:
        request = None
        if images_of(multi_modal_data) != ([], []):  # pixels are prepared off the event loop
            loop = asyncio.get_running_loop()
            request = await loop.run_in_executor(None, lambda: self._request(
                prompt_ids, sampling_params, request_id, lambda out: None, lambda exc: None, multi_modal_data))
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        poster = self._poster(loop)

        def on_done(out: TokenOutput) -> None:  # the stepping thread: a step's finished requests wake the loop once
            poster.post(lambda: future.done() or future.set_result(out))

        def on_error(exc: BaseException) -> None:
            poster.post(lambda: future.done() or future.set_exception(exc))

        if request is None:
            request = self._request(prompt_ids, sampling_params, request_id, on_done, on_error)
        else:
            request.on_done, request.on_error = on_done, on_error
        self._enqueue(request)
        if self._driver is None or self._driver.done() or self._driver.get_loop() is not loop:
            self._driver = loop.create_task(self._drive(loop))
        return await future

    def _poster(self, loop: asyncio.AbstractEventLoop) -> LoopPoster:
        poster = self._posters.get(loop)
        if poster is None:
            poster = self._posters[loop] = LoopPoster(loop)
        return poster

    async def _drive(self, loop: asyncio.AbstractEventLoop) -> None:
        """Step the batcher while work remains, yielding to the loop between steps so that requests
        submitted meanwhile join the next step."""
        poster = self._poster(loop)
        while self._has_work():
            await asyncio.sleep(0)
            stepped: asyncio.Future = loop.create_future()
            self._executor.submit(self._step_and_report, poster, stepped)
            try:
                await stepped
            except Exception:  # already delivered to every affected request by fail_all
                continue

    def _step_and_report(self, poster: LoopPoster, stepped: asyncio.Future) -> None:
        """One step in the stepping thread.  The requests it finishes and its own end reach the driver's loop
        together, in one wake-up after the step (not one per finished request, each competing with the rest of
        the step for the GIL)."""
        with LoopPoster.held():
            try:
                self._locked_step()
            except BaseException as exc:  # noqa: BLE001 - the driver learns it (its requests were told already)
                poster.post(lambda exc=exc: stepped.done() or stepped.set_exception(exc))
            else:
                poster.post(lambda: stepped.done() or stepped.set_result(None))

    def _locked_step(self) -> None:
        while self._abort_waiting.is_set():  # let abort_all() take the lock before the next step
            time.sleep(0.0005)
        with self._batcher.lock:
            try:
                with eval_mode(self.model):
                    self._step_under_lock()
            except EngineError:  # the step handed it to its requests already (requests submitted since are new)
                raise
            except BaseException as exc:  # failed around the step (the mode switch): nobody was told yet
                self._batcher.fail_all(engine_failure(exc, self.name, "a step", self._batcher.load()))
                raise

    # the points a sharded engine (rollout/hf/sharded_engine.py) takes over: where a request enters, whether work
    # remains, and one step under the batcher's lock
    def _enqueue(self, request: GenerationRequest) -> None:
        self._batcher.submit(request)

    def _has_work(self) -> bool:
        return self._batcher.has_work()

    def _step_under_lock(self) -> None:
        if self._batcher.has_work():
            self._batcher.step()

    def _abort_under_lock(self) -> int:
        return self._batcher.abort_all()

    def progress(self) -> tuple[int, str]:
        return self._batcher.progress(), self._batcher.doing

    def generate_batch(
        self, prompts: Sequence[list[int]], sampling_params: SamplingParams | Sequence[SamplingParams],
        multi_modal_data: Sequence[dict | None] | None = None,
    ) -> list[TokenOutput]:
        """All prompts through the continuous batcher in this thread; outputs in input order.
        ``multi_modal_data``: one entry per prompt (``None`` for text prompts)."""
        params = _per_request(sampling_params, len(prompts))
        media = list(multi_modal_data) if multi_modal_data is not None else [None] * len(prompts)
        if len(media) != len(prompts):
            raise ValueError(f"generate_batch: {len(media)} multi_modal_data entries for {len(prompts)} prompts")
        results: list[TokenOutput | None] = [None] * len(prompts)
        errors: list[BaseException] = []
        requests = []
        for i, (prompt, sp, mm) in enumerate(zip(prompts, params, media)):
            def on_done(out, i=i):
                results[i] = out
            requests.append(self._request(prompt, sp, f"batch-{i}", on_done, errors.append, mm))
            self._batcher.check(requests[-1])  # all or none: a bad request leaves nothing behind
        for request in requests:
            self._enqueue(request)
        remaining = len(prompts)
        with eval_mode(self.model):  # once for the whole batch: the per-step switch inside is then a no-op
            while remaining:
                self._locked_step()
                if errors:
                    raise errors[0]
                remaining = sum(r is None for r in results)
        return results  # type: ignore[return-value]

    # ------------------------------------------------------------------ hybrid-engine hooks
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy tensors into the engine's module by name; tensors that *are* its own storage (the
        colocated case: the actor and the engine share the module) are skipped, so that is free.
        Parked prefixes are dropped either way: a call means the policy changed."""
        with self._batcher.lock:
            self._batcher.drop_prefixes()  # parked K/V were computed with the previous weights
        own = dict(self.model.named_parameters())
        own.update(self.model.named_buffers())
        copied = 0
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = own.get(name)
                if target is None:
                    hint = closest(name, list(own))
                    raise KeyError(f"update_weights: the rollout model has no tensor '{name}'"
                                   + (f" (did you mean '{hint}'?)" if hint else ""))
                if target.data_ptr() == tensor.data_ptr():
                    continue
                if target.shape != tensor.shape:
                    raise ValueError(f"update_weights: '{name}' has shape {tuple(tensor.shape)}, the rollout "
                                     f"model expects {tuple(target.shape)} (pass full, unsharded tensors)")
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
                copied += 1
        return copied

    def weight_tensors(self, names: Sequence[str]) -> dict[str, torch.Tensor] | None:
        """The module's tensors of ``names`` (``None`` when it has not all of them: e.g. merged LoRA weights)."""
        own = dict(self.model.named_parameters())
        own.update(self.model.named_buffers())
        return {n: own[n] for n in names} if all(n in own for n in names) else None

    def sleep(self) -> None:
        """Before training: free the KV cache when ``free_cache_engine`` (weights stay: they are the
        actor's), and forget parked prefixes either way; generating raises until :meth:`wake_up`."""
        with self._batcher.lock:
            if self.free_cache_engine:
                self._batcher.release_cache()
                empty_cache()
            else:
                self._batcher.drop_prefixes()
        self._asleep = True

    def wake_up(self) -> None:
        """Allow generation again; a freed KV cache is reallocated, sized by the next requests."""
        with self._batcher.lock:
            self._batcher.drop_prefixes()  # the weights may have changed while asleep
        self._asleep = False

    def abort_all(self) -> int:
        """Finish every request in flight now with ``finish_reason="abort"`` and the tokens / log-probs
        generated so far (waiting requests with none); returns how many.  Waits for the step under way, at most
        120 s (an ``EngineError`` then: the engine is stuck).  The engine stays usable."""
        self._abort_waiting.set()
        try:
            if not self._batcher.lock.acquire(timeout=_ABORT_WAIT_S):  # a stuck step: never wait forever
                raise EngineError(f"rollout engine '{self.name}': the step under way has not finished in "
                                  f"{_ABORT_WAIT_S:.0f} s, so its requests cannot be aborted (the engine is stuck; "
                                  f"its replica's stall watchdog names where)")
            try:
                return self._abort_under_lock()
            finally:
                self._batcher.lock.release()
        finally:
            self._abort_waiting.clear()

    def reseed(self, seed: int) -> None:
        """Restart the engine's random stream (requests without ``SamplingParams.seed``)."""
        self.generator.manual_seed(seed)

    def stats(self) -> dict[str, int]:
        """Counters since construction: ``requests``, ``prompt_tokens``, ``prefill_tokens`` (run through the
        model), ``prefix_reused_tokens`` (taken from parked rows), ``shared_prefill_tokens`` (identical prompts
        prefilled once), ``prefix_hits``, ``prefill_forwards``, ``generated_tokens``, ``decode_steps``,
        ``parked``, ``evicted``, ``aborted``; and now: ``parked_rows``, ``kv_cache_rows``,
        ``kv_cache_columns``, ``kv_cache_bytes``."""
        return self._batcher.stats()

    @property
    def kv_cache_bytes(self) -> int:
        cache = self._batcher.cache
        return 0 if cache is None else cache.memory_bytes()
