"""Sampling parameters of one rollout request, built from verl's ``actor_rollout_ref.rollout`` keys.

Every engine (hf now, vLLM/SGLang later) receives the same small value object, so the trainer never
needs to know which engine runs: the field names follow vLLM's ``SamplingParams`` (what verl forwards
to its servers) and :meth:`SamplingParams.from_rollout_config` maps verl's config names onto them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["SamplingParams", "engine_request_settings"]


@dataclass(frozen=True)
class SamplingParams:
    """How to decode one request.

    * ``temperature`` -- logits are divided by it before sampling; 0 means greedy.
    * ``top_p`` -- nucleus sampling (Holtzman et al. 2020, "The Curious Case of Neural Text
      Degeneration"): keep the smallest set of tokens whose probability mass reaches ``top_p``.
    * ``top_k`` -- keep the ``top_k`` most likely tokens; ``-1`` (or 0, as HF writes it) turns it off.
    * ``n`` -- samples per prompt (GRPO group size).  Engines see ``n=1`` requests; the agent-loop manager
      expands ``n``.
    * ``do_sample`` -- False means greedy decoding whatever the temperature (verl's validation default).
    * ``max_tokens`` -- response budget (verl's ``rollout.response_length``).
    * ``stop_token_ids`` -- generation stops after emitting any of these (EOS ids included).
    * ``ignore_eos`` -- never stop early (benchmarks force fixed lengths this way, like vLLM).
    * ``logprobs`` -- also return the log-prob of each sampled token (verl's ``calculate_log_probs``).
    * ``seed`` -- when set, the draw of the request's t-th token depends only on ``(seed, t)`` and the
      logits, not on the other requests batched with it (vLLM's per-request seed); ``None`` uses the
      engine's own random stream.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    do_sample: bool = True
    max_tokens: int = 512
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}; use 1.0 to disable it")
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or a positive count, got {self.top_k}")
        if self.top_k == 0:  # HF spells "off" as 0, vLLM as -1: accept both, store one
            object.__setattr__(self, "top_k", -1)
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1 (samples per prompt), got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}; set rollout.response_length"
            )
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        """True when decoding takes the arg-max token (``do_sample=False`` or ``temperature=0``)."""
        return (not self.do_sample) or self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The temperature whose distribution the reported log-probs come from.

        Sampled tokens are scored under ``softmax(logits / temperature)`` -- the same scaling the actor
        applies when it recomputes ``old_log_probs`` (verl divides logits by ``rollout.temperature``).
        Greedy decoding has no sampling distribution, so its tokens are scored at temperature 1.
        """
        return 1.0 if self.greedy else float(self.temperature)

    def with_stop_tokens(self, token_ids: Iterable[int]) -> "SamplingParams":
        """A copy whose stop set also holds ``token_ids`` (e.g. the tokenizer's EOS ids)."""
        merged = tuple(dict.fromkeys([*self.stop_token_ids, *(int(t) for t in token_ids)]))
        if merged == self.stop_token_ids:
            return self
        return self._copy_with(stop_token_ids=merged)

    def _copy_with(self, **fields: Any) -> "SamplingParams":
        """A copy with ``fields`` replaced, for fields that need no checking (``seed``; ``stop_token_ids`` given
        as a tuple of ints): ``dataclasses.replace`` would run ``__init__`` and the checks of every field again,
        ~3 us that the rollout path paid twice for each of its requests."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(fields)
        return copy

    @classmethod
    def from_rollout_config(
        cls, rollout: Any, validate: bool = False, eos_token_ids: Iterable[int] = ()
    ) -> "SamplingParams":
        """Build from verl's rollout config (``actor_rollout_ref.rollout``), read by attribute.

        Training uses ``temperature, top_p, top_k, n, do_sample``; validation (``validate=True``) uses
        ``val_kwargs.{temperature, top_p, top_k, n, do_sample}``.  Both use ``response_length`` as the
        token budget, ``calculate_log_probs`` for the log-prob flag and ``ignore_eos``.
        """
        src = rollout.val_kwargs if validate else rollout
        return cls(
            temperature=float(src.temperature),
            top_p=float(src.top_p),
            top_k=int(src.top_k),
            n=int(src.n),
            do_sample=bool(src.do_sample),
            max_tokens=int(rollout.response_length),
            stop_token_ids=tuple(int(t) for t in eos_token_ids),
            ignore_eos=bool(rollout.ignore_eos),
            logprobs=bool(rollout.calculate_log_probs),
        )


def engine_request_settings(params: "SamplingParams", eos_token_ids: Iterable[int], rng, lock) -> tuple[list[int], int]:
    """``(stop token ids, seed)`` of one request as an external engine (vLLM, SGLang) receives it: the request's
    stop ids plus the model's EOS ids unless ``ignore_eos``, and its seed or the next draw of the engine's
    ``rng`` (under ``lock``: requests arrive from several threads).  Engines serve ``n=1`` requests only."""
    if params.n != 1:
        raise ValueError(f"SamplingParams.n={params.n}: engines see n=1 requests; the caller expands groups")
    stop = list(params.stop_token_ids)
    if not params.ignore_eos:
        stop += [t for t in eos_token_ids if t not in stop]
    with lock:
        seed = params.seed if params.seed is not None else rng.randrange(2**31)
    return stop, seed
