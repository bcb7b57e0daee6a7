"""The ``hf`` rollout engine: an in-process transformers causal LM behind the async engine interface.

It is the CPU / debugging engine and the colocated hybrid engine of small runs: it generates with the
very module the actor trains (no second copy of the weights, nothing to sync), so ``update_weights`` only
copies tensors that are not already the engine's own.  With FSDP2 the caller unshards the module (e.g.
``FSDPModule.unshard()``) around generation; the engine itself never touches sharding.

Concurrency model: :meth:`HFRolloutEngine.generate` enqueues a request and awaits its future; one driver
task per event loop runs :class:`~hybridflow.rollout.hf_batcher.ContinuousBatcher` steps in a worker thread,
so all requests in flight share each decode forward and the event loop stays free for agent-loop I/O.
:meth:`HFRolloutEngine.generate_batch` runs the same steps directly in the calling thread.

Attention must go through ``sdpa`` or ``eager`` (both take the engine's explicit 4-D masks);
FlashAttention-2 does not accept such masks and is rejected with a clear error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Iterable, Sequence

import torch

from hybridflow.engine.forward import eval_mode
from hybridflow.rollout.base import RolloutEngine, TokenOutput, _per_request
from hybridflow.rollout.hf_batcher import ContinuousBatcher, GenerationRequest
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.utils.registry import closest

__all__ = ["HFRolloutEngine"]

_SUPPORTED_ATTENTION = ("sdpa", "eager")


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


class HFRolloutEngine(RolloutEngine):
    """Generate with an HF ``*ForCausalLM`` module already in memory.

    ``eos_token_ids`` (default: the tokenizer's EOS, else the model's generation config) are added to
    every request's stop set unless the request sets ``ignore_eos``.  ``pad_token_id`` only fills the
    left padding of prefill batches (it is masked out).  ``max_batch_size`` bounds the decode batch and
    hence the KV-cache rows (verl's ``max_num_seqs``).  ``fast_decode`` runs decode steps through
    :mod:`~hybridflow.rollout.fast_decode` when the model's structure allows (same results, less overhead).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer=None,
        eos_token_ids: int | Iterable[int] | None = None,
        pad_token_id: int | None = None,
        max_batch_size: int = 256,
        seed: int = 0,
        fast_decode: bool = True,
    ):
        attn = getattr(model.config, "_attn_implementation", "sdpa")
        if attn not in _SUPPORTED_ATTENTION:
            raise ValueError(
                f"hf rollout engine needs attn_implementation in {_SUPPORTED_ATTENTION}, the model uses '{attn}'; "
                "load it with attn_implementation='sdpa'"
            )
        self.model = model
        if eos_token_ids is None:
            eos_token_ids = getattr(tokenizer, "eos_token_id", None)
        if eos_token_ids is None:
            gen_cfg = getattr(model, "generation_config", None)
            eos_token_ids = getattr(gen_cfg, "eos_token_id", None) or model.config.eos_token_id
        self.eos_token_ids = tuple(_as_id_list(eos_token_ids))
        if pad_token_id is None:
            pad_token_id = getattr(tokenizer, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        device = next(model.parameters()).device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._batcher = ContinuousBatcher(model, pad_token_id, max_batch_size, self.generator, fast_decode)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-rollout")
        self._driver: asyncio.Task | None = None
        self._asleep = False

    # ------------------------------------------------------------------ requests
    def _request(self, prompt_ids, params: SamplingParams, request_id: str, on_done, on_error) -> GenerationRequest:
        if self._asleep:
            raise RuntimeError("hf rollout engine is asleep; call wake_up() before generating")
        if not params.ignore_eos and self.eos_token_ids:
            params = params.with_stop_tokens(self.eos_token_ids)
        return GenerationRequest(request_id, [int(t) for t in prompt_ids], params, on_done, on_error)

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams, request_id: str) -> TokenOutput:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def on_done(out: TokenOutput) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(out))

        def on_error(exc: BaseException) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.set_exception(exc))

        self._batcher.submit(self._request(prompt_ids, sampling_params, request_id, on_done, on_error))
        if self._driver is None or self._driver.done() or self._driver.get_loop() is not loop:
            self._driver = loop.create_task(self._drive(loop))
        return await future

    async def _drive(self, loop: asyncio.AbstractEventLoop) -> None:
        """Step the batcher while work remains, yielding to the loop between steps so that requests
        submitted meanwhile join the next step."""
        while self._batcher.has_work():
            await asyncio.sleep(0)
            try:
                await loop.run_in_executor(self._executor, self._locked_step)
            except Exception:  # already delivered to every affected request by fail_all
                continue

    def _locked_step(self) -> None:
        with self._batcher.lock, eval_mode(self.model):
            if self._batcher.has_work():
                self._batcher.step()

    def generate_batch(
        self, prompts: Sequence[list[int]], sampling_params: SamplingParams | Sequence[SamplingParams]
    ) -> list[TokenOutput]:
        """All prompts through the continuous batcher in this thread; outputs in input order."""
        params = _per_request(sampling_params, len(prompts))
        results: list[TokenOutput | None] = [None] * len(prompts)
        errors: list[BaseException] = []
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            def on_done(out, i=i):
                results[i] = out
            self._batcher.submit(self._request(prompt, sp, f"batch-{i}", on_done, errors.append))
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
        colocated case: the actor and the engine share the module) are skipped, so that is free."""
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

    def sleep(self) -> None:
        """Free the KV cache (weights stay: they are the actor's); generating raises until wake_up()."""
        with self._batcher.lock:
            self._batcher.release_cache()
        self._asleep = True

    def wake_up(self) -> None:
        """Allow generation again; the KV cache is reallocated lazily by the next prefill."""
        self._asleep = False

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @property
    def kv_cache_bytes(self) -> int:
        cache = self._batcher.cache
        return 0 if cache is None else cache.memory_bytes()
