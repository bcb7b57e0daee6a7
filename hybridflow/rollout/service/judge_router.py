"""The judge router: a generative reward model's replicas behind one HTTP address (verl's reward router).

Reward functions run in scoring processes of their own (``rewards/pool.py``), so they reach the judge the way
verl's reward loop lets them: an address (``reward_router_address``, ``host:port``) serving the OpenAI API that
vLLM / SGLang servers speak.  The router renders chats with the judge's own tokenizer and chat template, sends
token ids to the judge's replicas through the rollout service's :class:`AsyncLLMServerManager` (least-loaded
routing, the same data plane as the policy's rollouts) and answers in OpenAI's JSON:

* ``POST /v1/chat/completions`` -- ``{"messages": [...], "max_tokens"?, "temperature"?, "top_p"?, "top_k"?,
  "seed"?}`` -> ``{"choices": [{"message": {"role": "assistant", "content": ...}, "finish_reason": ...}],
  "usage": {...}}``;
* ``POST /v1/completions`` -- ``{"prompt": "text" | [token ids], ...}`` -> ``{"choices": [{"text": ...}]}``;
* ``GET /health``, ``GET /stats`` (the counters below).

Limits, shared by every scorer of the run (``reward_model.judge``): at most ``max_concurrent`` requests in
flight, ``max_rpm`` requests and ``max_tpm`` tokens (prompt + generated) per minute (token buckets; a request
waits for its share), and ``request_timeout_s`` per request, waiting included: past it the router answers 504 and
the request counts as a timeout.  A prompt longer than ``prompt_length`` tokens is refused (400).  Counters
(``judge/requests``, ``judge/timeouts``, ``judge/rejected``, ``judge/errors``, ``judge/prompt_tokens``,
``judge/completion_tokens``, ``judge/wait_s``, ``judge/latency_s``) are read per step by the trainer.

The server runs on its own event loop in a daemon thread of the process that starts it (the controller).
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from hybridflow.rollout.service.server_manager import AsyncLLMServerManager

__all__ = ["JudgeLimits", "TokenBucket", "JudgeRouter"]


@dataclass(frozen=True)
class JudgeLimits:
    max_concurrent: int = 64  # <= 0: none
    max_rpm: float | None = None
    max_tpm: float | None = None
    request_timeout_s: float = 120.0
    prompt_length: int = 2048
    response_length: int = 2048


class TokenBucket:
    """``rate`` tokens per second, holding at most ``capacity`` (one second's worth by default)."""

    def __init__(self, rate: float, capacity: float | None = None):
        if rate <= 0:
            raise ValueError(f"a token bucket needs a positive rate, got {rate}")
        self.rate = float(rate)
        self.capacity = float(capacity if capacity is not None else max(rate, 1.0))
        self.tokens = self.capacity
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    async def take(self, amount: float) -> None:
        """Wait until ``amount`` tokens are available and take them (an amount above the capacity takes the
        bucket to zero and below: later requests wait for the debt)."""
        async with self._lock:
            self._refill()
            need = min(amount, self.capacity)
            if self.tokens < need:
                await asyncio.sleep((need - self.tokens) / self.rate)
                self._refill()
            self.tokens -= amount

    def charge(self, amount: float) -> None:
        """Take ``amount`` without waiting (tokens generated: known only afterwards)."""
        self._refill()
        self.tokens -= amount


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class JudgeRouter:
    """Serve ``replicas`` (the judge fleet's) at ``address`` (see the module docstring).

    ``tokenizer`` is the judge's; ``defaults`` are sampling settings for requests that set none."""

    def __init__(self, replicas: list, tokenizer: Any, limits: JudgeLimits, defaults: dict[str, Any] | None = None,
                 host: str = "127.0.0.1", name: str = "judge"):
        self.manager = AsyncLLMServerManager(replicas, default_max_tokens=limits.response_length)
        self.tokenizer = tokenizer
        self.limits = limits
        self.defaults = dict(defaults or {})
        self.name = name
        self.host = host
        self.port = _free_port(host)
        self._ids = itertools.count()
        self._stats_lock = threading.Lock()
        self._stats: dict[str, float] = {}
        self._reset()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name=f"{name}-router", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=60) or self._error is not None:
            raise RuntimeError(f"the {name} router did not start on {host}:{self.port}: {self._error}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------------ counters
    def _reset(self) -> None:
        self._stats = {k: 0.0 for k in ("requests", "completed", "timeouts", "rejected", "errors", "prompt_tokens",
                                        "completion_tokens", "wait_s", "latency_s")}

    def _add(self, **values: float) -> None:
        with self._stats_lock:
            for key, value in values.items():
                self._stats[key] += float(value)

    def take_metrics(self) -> dict[str, float]:
        """``judge/*`` counters since the last call (then reset); ``wait_s`` / ``latency_s`` as means."""
        with self._stats_lock:
            stats, _ = dict(self._stats), self._reset()
        done = max(stats["completed"], 1.0)
        out = {f"judge/{k}": v for k, v in stats.items() if k not in ("wait_s", "latency_s")}
        out["judge/wait_s"] = stats["wait_s"] / max(stats["requests"], 1.0)
        out["judge/latency_s"] = stats["latency_s"] / done
        return out

    def stats(self) -> dict[str, float]:
        with self._stats_lock:
            return dict(self._stats)

    # ------------------------------------------------------------------ server
    def _serve(self) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        limits = self.limits
        self._semaphore = asyncio.Semaphore(limits.max_concurrent) if limits.max_concurrent > 0 else None
        self._rpm = TokenBucket(limits.max_rpm / 60.0) if limits.max_rpm else None
        self._tpm = TokenBucket(limits.max_tpm / 60.0) if limits.max_tpm else None
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", lambda request: web.json_response({"status": "ok"}))
        app.router.add_get("/stats", lambda request: web.json_response(self.stats()))
        runner = web.AppRunner(app, access_log=None)
        try:
            self._loop.run_until_complete(runner.setup())
            self._loop.run_until_complete(web.TCPSite(runner, self.host, self.port).start())
        except BaseException as e:  # noqa: BLE001 - reported by __init__
            self._error = e
            self._ready.set()
            return
        self._runner = runner
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ handlers
    def _params(self, body: dict[str, Any]) -> dict[str, Any]:
        params = {k: body[k] for k in ("temperature", "top_p", "top_k", "seed") if body.get(k) is not None}
        for key, value in self.defaults.items():
            params.setdefault(key, value)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or self.limits.response_length
        params["max_tokens"] = min(int(max_tokens), self.limits.response_length)
        return params

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return web.json_response({"error": {"message": "'messages' must be a non-empty list"}}, status=400)
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return await self._answer(list(ids), self._params(body), chat=True)

    async def _completions(self, request):
        from aiohttp import web

        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = prompt
        else:
            return web.json_response({"error": {"message": "'prompt' must be a string or a list of token ids"}},
                                     status=400)
        return await self._answer(list(ids), self._params(body), chat=False)

    async def _answer(self, ids: list[int], params: dict[str, Any], chat: bool):
        from aiohttp import web

        self._add(requests=1)
        if len(ids) > self.limits.prompt_length:
            self._add(rejected=1)
            return web.json_response({"error": {"message": f"the judge prompt has {len(ids)} tokens, more than "
                                                f"reward_model.rollout.prompt_length={self.limits.prompt_length}"}},
                                     status=400)
        start = time.monotonic()
        try:
            output, waited = await asyncio.wait_for(self._limited(ids, params), self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            self._add(timeouts=1, wait_s=time.monotonic() - start)
            return web.json_response({"error": {"message": f"the judge did not answer within reward_model.judge."
                                                f"request_timeout_s={self.limits.request_timeout_s}"}}, status=504)
        except Exception as e:  # noqa: BLE001 - the caller gets the reason; the run goes on
            self._add(errors=1)
            return web.json_response({"error": {"message": f"{type(e).__name__}: {e}"}}, status=500)
        tokens = list(output.token_ids)
        if tokens and tokens[-1] == self.tokenizer.eos_token_id and output.finish_reason == "stop":
            tokens = tokens[:-1]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        self._add(completed=1, prompt_tokens=len(ids), completion_tokens=len(output.token_ids), wait_s=waited,
                  latency_s=time.monotonic() - start)
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(output.token_ids),
                 "total_tokens": len(ids) + len(output.token_ids)}
        finish = output.finish_reason if output.finish_reason in ("stop", "length") else "stop"
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            kind = "text_completion"
        return web.json_response({"id": f"{self.name}-{next(self._ids)}", "object": kind, "created": int(time.time()),
                                  "model": self.name, "choices": [choice], "usage": usage})

    async def _limited(self, ids: list[int], params: dict[str, Any]):
        """Generate under the limits; returns (output, seconds spent waiting for them)."""
        start = time.monotonic()
        if self._rpm is not None:
            await self._rpm.take(1.0)
        if self._tpm is not None:
            await self._tpm.take(float(len(ids)))
        if self._semaphore is not None:
            await self._semaphore.acquire()
        waited = time.monotonic() - start
        try:
            output = await self.manager.generate(f"{self.name}-{next(self._ids)}", prompt_ids=ids,
                                                 sampling_params=params)
        finally:
            if self._semaphore is not None:
                self._semaphore.release()
        if self._tpm is not None:
            self._tpm.charge(float(len(output.token_ids)))
        return output, waited
