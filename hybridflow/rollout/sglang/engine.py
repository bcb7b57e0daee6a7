"""The ``sglang`` rollout engine: an SGLang server process behind the async token-in/token-out interface.

UNVERIFIED: SGLang has no CPU build, so this adapter has not run yet (CI and the developers' machines have no
GPU); starting it prints one line saying so.  It was written against SGLang 0.5's HTTP API:

* ``POST /generate`` with ``input_ids``, ``sampling_params`` (``temperature, top_p, top_k, max_new_tokens,
  stop_token_ids, ignore_eos, sampling_seed``) and ``return_logprob`` -> ``output_ids``,
  ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` per token) and ``meta_info.finish_reason``;
* ``POST /update_weights_from_disk`` with a safetensors folder under /dev/shm (the actor's weights; the model's
  ``config.json`` is copied beside them), ``flush_cache`` on;
* ``POST /release_memory_occupation`` / ``/resume_memory_occupation`` (server started with
  ``--enable-memory-saver`` when ``free_cache_engine``); ``POST /abort_request`` with ``abort_all``.

verl's keys map to server flags: ``tensor_model_parallel_size -> --tp-size``, ``gpu_memory_utilization ->
--mem-fraction-static``, ``max_num_seqs -> --max-running-requests``, ``max_model_len -> --context-length``,
``enable_prefix_caching=false -> --disable-radix-cache``, ``enforce_eager -> --disable-cuda-graph``,
``max_num_batched_tokens -> --chunked-prefill-size`` (with ``enable_chunked_prefill``), ``dtype``, ``load_format``,
``seed -> --random-seed``; ``engine_kwargs.sglang`` adds any other flag (``{flag_name: value}``).
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import torch

from hybridflow.rollout.base import RolloutEngine, TokenOutput, _per_request
from hybridflow.rollout.sampling_params import SamplingParams, engine_request_settings
from hybridflow.rollout.service.server_process import ServerProcess, ServerProcessError
from hybridflow.rollout.weights.transfer import model_config, shm_folder, with_tied_head, write_safetensors_folder

if TYPE_CHECKING:
    from hybridflow.config.schema import RolloutConfig

__all__ = ["SGLangRolloutEngine", "SGLangServerProcess", "SGLangServerError", "sglang_server_args",
           "UNVERIFIED_NOTICE"]

UNVERIFIED_NOTICE = ("hybridflow: note: rollout.name=sglang is UNVERIFIED -- this adapter has never run on a GPU "
                     "(SGLang has no CPU build); compare its log-probs with the actor's "
                     "(training/rollout_probs_diff_mean) before trusting a run")


class SGLangServerError(ServerProcessError):
    """An SGLang server failed to start, died, or answered with an error."""


def sglang_server_args(rollout: Any, model_path: str) -> list[str]:
    """``python -m sglang.launch_server`` flags for verl's rollout config (read by attribute)."""
    max_len = rollout.max_model_len or (int(rollout.prompt_length) + int(rollout.response_length))
    args = ["--model-path", str(model_path), "--dtype", str(rollout.dtype),
            "--tp-size", str(int(rollout.tensor_model_parallel_size)),
            "--dp-size", str(int(rollout.data_parallel_size)),
            "--mem-fraction-static", str(float(rollout.gpu_memory_utilization)),
            "--max-running-requests", str(int(rollout.max_num_seqs)),
            "--context-length", str(int(max_len)), "--random-seed", str(int(rollout.seed)),
            "--load-format", str(rollout.load_format), "--skip-tokenizer-init"]
    if not rollout.enable_prefix_caching:
        args.append("--disable-radix-cache")
    if rollout.enforce_eager:
        args.append("--disable-cuda-graph")
    if rollout.enable_chunked_prefill:
        args += ["--chunked-prefill-size", str(int(rollout.max_num_batched_tokens))]
    if rollout.free_cache_engine:
        args.append("--enable-memory-saver")
    for key, value in dict(rollout.engine_kwargs.get("sglang") or {}).items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (False, None):
            args += [flag, json.dumps(value) if isinstance(value, (dict, list)) else str(value)]
    return args


class SGLangServerProcess(ServerProcess):
    kind = "SGLang server"
    error_type = SGLangServerError

    def __init__(self, server_args: list[str], name: str = "sglang-0", python: str | None = None, **kwargs):
        super().__init__(name, **kwargs)
        self.server_args = list(server_args)
        self.python = python or sys.executable

    def command(self) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", *self.server_args, "--host", self.host,
                "--port", str(self.port)]


class SGLangRolloutEngine(RolloutEngine):
    """Starts one SGLang server (``rollout_config`` = verl's ``actor_rollout_ref.rollout``) and serves requests.

    ``eos_token_ids`` join every request's stop set unless it sets ``ignore_eos`` (the server skips its tokenizer).
    """

    def __init__(self, model_path: str, rollout_config: RolloutConfig | None = None, server_args: list[str] | None = None, *,
                 tokenizer: Any = None, eos_token_ids: int | Iterable[int] | None = None, seed: int = 0,
                 free_cache_engine: bool = True, log_dir: str | None = None, start_timeout_s: float = 900.0,
                 name: str = "sglang"):
        import importlib.util

        if importlib.util.find_spec("sglang") is None:
            raise ImportError("actor_rollout_ref.rollout.name=sglang needs the 'sglang' package: pip install "
                              "hybridflow[sglang] on a GPU machine (SGLang has no CPU build)")
        print(UNVERIFIED_NOTICE, file=sys.stderr, flush=True)
        args = sglang_server_args(rollout_config, model_path) if rollout_config is not None else \
            ["--model-path", str(model_path), "--skip-tokenizer-init"]
        if server_args:
            args += list(server_args)
        self.name = name
        self.model_path = str(model_path)
        self.free_cache_engine = bool(rollout_config.free_cache_engine) if rollout_config is not None \
            else bool(free_cache_engine)
        if eos_token_ids is None and tokenizer is not None:
            eos_token_ids = tokenizer.eos_token_id
        if eos_token_ids is None:
            eos_token_ids = model_config(self.model_path).get("eos_token_id")
        self.eos_token_ids = () if eos_token_ids is None else (
            (int(eos_token_ids),) if isinstance(eos_token_ids, int) else tuple(int(t) for t in eos_token_ids))
        self._tied = bool(model_config(self.model_path).get("tie_word_embeddings", False))
        self._rng = random.Random(int(seed))
        self._lock = threading.Lock()
        self._sessions: dict[int, Any] = {}
        self._shm_dir: str | None = None
        self._asleep = False
        self.server = SGLangServerProcess(args, name=name, log_dir=log_dir, start_timeout_s=start_timeout_s).start()

    # ------------------------------------------------------------------ requests
    def payload(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        stop, seed = engine_request_settings(params, self.eos_token_ids, self._rng, self._lock)
        return {
            "input_ids": [int(t) for t in prompt_ids],
            "sampling_params": {
                "temperature": 0.0 if params.greedy else float(params.temperature),
                "top_p": 1.0 if params.greedy else float(params.top_p),
                "top_k": -1 if params.greedy else int(params.top_k),
                "max_new_tokens": int(params.max_tokens), "stop_token_ids": stop,
                "ignore_eos": bool(params.ignore_eos), "sampling_seed": int(seed) % (2**63),
                "skip_special_tokens": False,
            },
            "return_logprob": bool(params.logprobs),
            "logprob_start_len": -1,
        }

    async def _session(self):
        import aiohttp

        loop = asyncio.get_running_loop()
        session = self._sessions.get(id(loop))
        if session is None or session.closed:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            self._sessions[id(loop)] = session
        return session

    async def generate(self, prompt_ids: list[int], sampling_params: SamplingParams, request_id: str,
                       multi_modal_data=None) -> TokenOutput:
        if multi_modal_data:
            raise NotImplementedError("the sglang rollout engine is text-only here")
        if self._asleep:
            raise RuntimeError(f"SGLang engine '{self.name}' is asleep; call wake_up() before generating")
        import aiohttp

        session = await self._session()
        body = self.payload(prompt_ids, sampling_params)
        try:
            async with session.post(f"{self.server.url}/generate", json=body) as resp:
                data = await resp.json(content_type=None)
                if resp.status != 200:
                    raise SGLangServerError(f"SGLang server '{self.name}' answered {resp.status} to '{request_id}': "
                                            f"{json.dumps(data)[:2000]}")
        except (aiohttp.ClientError, OSError) as e:
            self.server.check_alive()
            raise SGLangServerError(f"SGLang server '{self.name}' failed on '{request_id}': {e}") from None
        return parse_sglang_output(request_id, data, bool(sampling_params.logprobs))

    def generate_batch(self, prompts, sampling_params) -> list[TokenOutput]:
        params = _per_request(sampling_params, len(prompts))

        async def run():
            try:
                return await asyncio.gather(*(self.generate(list(p), sp, f"batch-{i}")
                                              for i, (p, sp) in enumerate(zip(prompts, params))))
            finally:
                session = self._sessions.pop(id(asyncio.get_running_loop()), None)
                if session is not None:
                    await session.close()

        return asyncio.run(run())

    # ------------------------------------------------------------------ hybrid-engine hooks
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        if self._shm_dir is None:
            self._shm_dir = shm_folder(self.name)
        folder = Path(self._shm_dir) / "weights"
        tensors = with_tied_head(named_tensors) if self._tied else named_tensors
        count = write_safetensors_folder(tensors, folder)
        for extra in ("config.json", "generation_config.json"):
            src = Path(self.model_path) / extra
            if src.is_file():
                shutil.copy(src, folder / extra)
        was_asleep = self._asleep
        if was_asleep:
            self.server.post("/resume_memory_occupation", {"tags": ["weights"]})
        result = self.server.post("/update_weights_from_disk", {"model_path": str(folder), "flush_cache": True})
        if isinstance(result, dict) and result.get("success") is False:
            raise SGLangServerError(f"SGLang server '{self.name}' refused the weights: {result.get('message')}")
        return count

    def sleep(self) -> None:
        if self.free_cache_engine:
            self.server.post("/release_memory_occupation", {})
        self._asleep = True

    def wake_up(self) -> None:
        if self._asleep and self.free_cache_engine:
            self.server.post("/resume_memory_occupation", {})
        self._asleep = False

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._rng = random.Random(int(seed))

    def abort_all(self) -> None:
        self.server.post("/abort_request", {"abort_all": True})

    def shutdown(self) -> None:
        self.server.stop()
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
            self._shm_dir = None


def parse_sglang_output(request_id: str, data: dict, want_log_probs: bool) -> TokenOutput:
    """An SGLang ``/generate`` answer as a :class:`TokenOutput`."""
    meta = data.get("meta_info") or {}
    token_ids = [int(t) for t in (data.get("output_ids") or [])]
    log_probs = None
    if want_log_probs:
        entries = meta.get("output_token_logprobs") or []
        log_probs = [float(e[0]) for e in entries][: len(token_ids)]
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else finish
    reason = kind if kind in ("stop", "length") else "abort"
    return TokenOutput(request_id, token_ids, log_probs, reason)
