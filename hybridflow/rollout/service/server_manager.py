"""``AsyncLLMServerManager``: the agent loops' one door to the rollout replicas (verl's class and call).

``await server_manager.generate(request_id=..., prompt_ids=..., sampling_params={...})`` returns a
:class:`~hybridflow.rollout.base.TokenOutput` (token ids, log-probs, finish reason).  Routing:

* **sticky**: every call with the same ``request_id`` goes to the replica that served its first call
  (an LRU map), so the turns of one trajectory find their prefix in that replica's cache;
* **least outstanding requests** for a new ``request_id``: the replica with the fewest requests in
  flight *now* (ties go to the lower index), so a replica stuck with long responses gets fewer new ones.

``sampling_params`` is verl's dict (``temperature, top_p, top_k, logprobs, max_tokens, seed, do_sample,
repetition_penalty``) or a :class:`SamplingParams`.  When it carries a ``seed``, call k of a request id is
sampled with a seed derived from (seed, k): the turns of a trajectory get different draws, and the
draws depend only on the trajectory, never on routing or batching.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any, Sequence

from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.service.replica import RolloutReplica
from hybridflow.rollout.sampling_params import SamplingParams

__all__ = ["AsyncLLMServerManager", "derive_seed"]

_DICT_KEYS = ("temperature", "top_p", "top_k", "logprobs", "max_tokens", "seed", "do_sample", "ignore_eos",
              "stop_token_ids")


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any printable parts (stable across processes and Python hash seeds)."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class AsyncLLMServerManager:
    """Routes token-in/token-out requests over ``replicas``.

    ``default_max_tokens`` is the budget of a request whose params name none (verl's
    ``rollout.response_length``); ``max_sticky`` bounds the request-id map.
    """

    _TEMPLATES_MAX = 64  # distinct sampling dicts (seed aside) whose converted SamplingParams are kept

    def __init__(self, replicas: Sequence[RolloutReplica], default_max_tokens: int, max_sticky: int = 10000):
        if not replicas:
            raise ValueError("AsyncLLMServerManager needs at least one rollout replica")
        self.replicas = list(replicas)
        self.default_max_tokens = int(default_max_tokens)
        self.max_sticky = int(max_sticky)
        self.outstanding = [0] * len(self.replicas)
        self.served = [0] * len(self.replicas)
        self._sticky: collections.OrderedDict[str, list[int]] = collections.OrderedDict()  # id -> [replica, calls]
        # verl's sampling dict (its items but the seed) -> its SamplingParams without a seed: every trajectory of a
        # batch sends the same dict but for its seed, and converting and checking it cost ~2.5 us a request
        self._templates: dict[tuple, SamplingParams] = {}

    # ------------------------------------------------------------------ routing
    def _route(self, request_id: str) -> tuple[int, int]:
        """(replica index, how many earlier calls this request id made)."""
        entry = self._sticky.get(request_id)
        if entry is None:
            index = min(range(len(self.replicas)), key=lambda i: (self.outstanding[i], i))
            entry = self._sticky[request_id] = [index, 0]
            if len(self._sticky) > self.max_sticky:
                self._sticky.popitem(last=False)
        else:
            self._sticky.move_to_end(request_id)
        call = entry[1]
        entry[1] += 1
        return entry[0], call

    def release(self, request_id: str) -> None:
        """Forget a finished trajectory's routing (optional: the LRU bound also evicts it)."""
        self._sticky.pop(request_id, None)

    # ------------------------------------------------------------------ requests
    def to_sampling_params(self, sampling_params: dict[str, Any] | SamplingParams) -> SamplingParams:
        """verl's sampling dict (or a ``SamplingParams``) as the engines' value object."""
        if isinstance(sampling_params, SamplingParams):
            return sampling_params
        seed = sampling_params.get("seed")
        try:
            key = tuple(sorted((k, type(v).__name__, v) for k, v in sampling_params.items() if k != "seed"))
            template = self._templates.get(key)
        except TypeError:  # an unhashable value (a list of stop ids): convert it afresh
            key, template = None, None
        if template is None:
            template = self._convert({k: v for k, v in sampling_params.items() if k != "seed"})
            if key is not None and len(self._templates) < self._TEMPLATES_MAX:
                self._templates[key] = template
        return template if seed is None else template._copy_with(seed=seed)

    def _convert(self, sampling_params: dict[str, Any]) -> SamplingParams:
        params = dict(sampling_params)
        penalty = params.pop("repetition_penalty", 1.0)
        if penalty not in (None, 1.0):
            raise ValueError(f"sampling_params.repetition_penalty={penalty}: the rollout engines sample from the "
                             "policy's own distribution (the log-probs PPO needs); use 1.0")
        unknown = sorted(set(params) - set(_DICT_KEYS))
        if unknown:
            raise ValueError(f"sampling_params has unknown key(s) {unknown}; known: {', '.join(_DICT_KEYS)}")
        params.setdefault("max_tokens", self.default_max_tokens)
        if params.get("top_k") is None:
            params["top_k"] = -1
        if "temperature" in params and float(params["temperature"]) == 0.0:
            params.setdefault("do_sample", False)
        if "stop_token_ids" in params:
            params["stop_token_ids"] = tuple(params["stop_token_ids"])
        params["logprobs"] = bool(params.get("logprobs", False))
        return SamplingParams(**params)

    async def generate(self, request_id: str, *, prompt_ids: list[int],
                       sampling_params: dict[str, Any] | SamplingParams, image_data: Any = None,
                       video_data: Any = None, audio_data: Any = None, mm_processor_kwargs: dict | None = None,
                       priority: int = 0) -> TokenOutput:
        """One turn of ``request_id``: generate from ``prompt_ids`` on the trajectory's replica.

        verl's keywords: ``priority`` is accepted and has no effect (requests are served as they come);
        ``audio_data`` and ``mm_processor_kwargs`` are refused (no audio models; the processor's settings are
        the model's own)."""
        if audio_data is not None:
            raise ValueError("server_manager.generate(audio_data=...): audio inputs are not supported by the rollout "
                             "engines; pass image_data / video_data only")
        if mm_processor_kwargs:
            raise ValueError(f"server_manager.generate(mm_processor_kwargs={mm_processor_kwargs!r}): per-request "
                             "processor settings are not supported; the processor's own configuration is used")
        params = self.to_sampling_params(sampling_params)
        index, call = self._route(request_id)
        if params.seed is not None and call > 0:
            params = params._copy_with(seed=derive_seed(params.seed, call))
        multi_modal = {k: v for k, v in (("images", image_data), ("videos", video_data)) if v is not None} or None
        self.outstanding[index] += 1
        try:
            return await self.replicas[index].generate(f"{request_id}/{call}", list(prompt_ids), params, multi_modal)
        finally:
            self.outstanding[index] -= 1
            self.served[index] += 1
