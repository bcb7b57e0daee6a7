"""Load HF tokenizers and models for the training roles (actor/ref, critic, reward model).

* actor / ref: ``AutoModelForCausalLM``; a vision-language checkpoint (its config has a ``vision_config``)
  loads through ``AutoModelForImageTextToText`` and its processor through :func:`load_processor`
  (``engine/vision.py`` says which VLMs are supported).
* critic: as verl, the critic is a *causal-LM checkpoint* loaded as
  ``AutoModelForTokenClassification(num_labels=1)``: the backbone weights come from the checkpoint
  and the one-output ``score`` head is freshly initialised; per-token values are ``logits[..., 0]``.
  This keeps one loading path for every HF architecture that has a token-classification class
  (Llama, Qwen2/3, Mistral, Gemma...), with no hand-written value-head module to keep in sync.
* reward model: ``AutoModelForSequenceClassification(num_labels=1)``; the score is read at the last
  valid token (the RM worker does that, see ``workers/reward_model.py``).

Dtype defaults to fp32 (the master weights FSDP keeps; the GPU computes in bf16 through FSDP's
mixed-precision policy), the attention kernel is chosen by ``engine/device.py`` (``eager`` for a class without an
sdpa path, e.g. Gemma-2, whose attention logit soft-capping sdpa cannot apply).
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable

import torch

from hybridflow.engine import device as dev
from hybridflow.engine.lora_options import LoraOptions, init_adapters
from hybridflow.engine.transformers_adapter import causal_lm_model_types, loadable_attention
from hybridflow.engine.vision import check_supported_vlm, is_vision_language_config, vision_linear_names

__all__ = [
    "ModelLoadError",
    "check_weight_files",
    "load_tokenizer",
    "load_hf_config",
    "load_causal_lm",
    "load_processor",
    "load_value_model",
    "load_reward_model",
    "apply_lora",
    "load_lora_adapter",
    "read_adapter_config",
    "enable_gradient_checkpointing",
]


class ModelLoadError(ValueError):
    """A model or tokenizer could not be loaded; the message names the config field to fix."""


# A tokenizer folder holds at least one of these (fast tokenizers, BPE, WordPiece, SentencePiece, tiktoken).
_VOCAB_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt", "spiece.model",
                "sentencepiece.bpe.model", "qwen.tiktoken", "tokenizer.tiktoken", "vocab.model")


def check_weight_files(path: str, field: str) -> None:
    """Open the header of every ``*.safetensors`` file of a local model folder: a truncated or corrupt file is
    named here, not as a bare deserialisation error from deep inside ``from_pretrained``."""
    src = os.path.expanduser(path)
    if not os.path.isdir(src):
        return
    from safetensors import safe_open

    for name in sorted(os.listdir(src)):
        if not name.endswith(".safetensors"):
            continue
        file = os.path.join(src, name)
        try:
            with safe_open(file, framework="pt") as f:
                f.keys()
        except Exception as e:  # SafetensorError has no importable base class across versions
            raise ModelLoadError(
                f"weight file {file} ({os.path.getsize(file)} bytes) of {field} is corrupt or truncated ({e}); "
                "re-download or re-export the model") from None


def _resolve_path(path: str, field: str) -> str:
    if not path:
        raise ModelLoadError(f"{field} is empty; set it to a local HF model folder or a hub id")
    expanded = os.path.expanduser(path)
    return expanded if os.path.exists(expanded) else path


def load_tokenizer(
    path: str,
    trust_remote_code: bool = False,
    custom_chat_template: str | None = None,
    require_chat_template: bool = True,
    field: str = "actor_rollout_ref.model.tokenizer_path",
):
    """Load a tokenizer, attach ``custom_chat_template`` if given, and make sure padding works.

    RL prompts are chat messages, so a tokenizer without a chat template cannot render them:
    that is an error at start-up (naming the config key to set) rather than a crash mid-run.
    A missing pad token falls back to EOS, as verl does, because batched rollout needs one.
    """
    from transformers import AutoTokenizer

    src = _resolve_path(path, field)
    try:
        tok = AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"cannot load a tokenizer from {field}={path!r}: {e}. Point it at a folder holding "
            "tokenizer.json/tokenizer_config.json or at a hub id reachable from this machine."
        ) from e
    if len(tok) <= 1 or (os.path.isdir(src) and not any(os.path.exists(os.path.join(src, f)) for f in _VOCAB_FILES)):
        found = sorted(os.listdir(src)) if os.path.isdir(src) else []
        raise ModelLoadError(
            f"{field}={path!r} has no tokenizer: none of {', '.join(_VOCAB_FILES[:4])}... is there (found: "
            f"{', '.join(found[:12]) or 'nothing'}), and without one every prompt would be empty. Copy the "
            "tokenizer files of the base model into that folder, or set actor_rollout_ref.model.tokenizer_path")
    if custom_chat_template:
        tok.chat_template = custom_chat_template
    if require_chat_template and not getattr(tok, "chat_template", None):
        raise ModelLoadError(
            f"the tokenizer at {path!r} has no chat template, so chat prompts cannot be rendered. "
            "Set actor_rollout_ref.model.custom_chat_template to a Jinja chat template "
            "(e.g. ChatML) or use a chat/instruct checkpoint."
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_hf_config(path: str, trust_remote_code: bool = False, override_config: dict | None = None,
                   field: str = "model.path"):
    """``AutoConfig`` with ``override_config`` applied (verl's ``model.override_config``)."""
    from transformers import AutoConfig

    src = _resolve_path(path, field)
    try:
        cfg = AutoConfig.from_pretrained(src, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise ModelLoadError(
            f"cannot load a model config from {field}={path!r}: {e}. It must be a local HF folder "
            "with config.json or a hub id reachable from this machine."
        ) from e
    for key, value in dict(override_config or {}).items():
        setattr(cfg, key, value)
    return cfg


def check_causal_lm(path: str, trust_remote_code: bool = False, field: str = "actor_rollout_ref.model.path") -> None:
    """Fail on the controller, before any worker starts, when ``path`` is not a causal LM (e.g. DistilBERT)."""
    cfg = load_hf_config(path, trust_remote_code, None, field)
    if is_vision_language_config(cfg):
        try:
            check_supported_vlm(cfg, f"{field}={path!r}")
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        return
    check_weight_files(path, field)
    remote = trust_remote_code and "AutoModelForCausalLM" in (getattr(cfg, "auto_map", None) or {})
    if not remote and cfg.model_type not in causal_lm_model_types():
        raise ModelLoadError(f"{field}={path!r} is a '{cfg.model_type}' model, which has no causal-LM (text "
                             f"generation) class; point {field} at a decoder-only checkpoint such as Qwen2 or Llama")


def _from_pretrained(auto_cls, path: str, cfg, dtype, trust_remote_code: bool, field: str, **kwargs):
    src = _resolve_path(path, field)
    check_weight_files(src, field)
    try:
        return auto_cls.from_pretrained(
            src,
            config=cfg,
            dtype=dtype,
            attn_implementation=loadable_attention(auto_cls, cfg, dev.attn_implementation()),
            trust_remote_code=trust_remote_code,
            **kwargs,
        )
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load {auto_cls.__name__} weights from {field}={path!r}: {e}") from e


def load_causal_lm(
    path: str,
    dtype: str | torch.dtype | None = "fp32",
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    field: str = "actor_rollout_ref.model.path",
    hf_config_path: str | None = None,
):
    """The policy / reference model. ``dtype`` is the *parameter* dtype (fp32 master weights by default).

    A vision-language checkpoint loads as ``AutoModelForImageTextToText`` (Qwen2-VL family only).
    ``hf_config_path`` (verl's ``model.hf_config_path``) takes the model config from another folder.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = load_hf_config(hf_config_path or path, trust_remote_code, override_config,
                         "actor_rollout_ref.model.hf_config_path" if hf_config_path else field)
    auto_cls = AutoModelForCausalLM
    if is_vision_language_config(cfg):
        try:
            check_supported_vlm(cfg, f"{field}={path!r}")
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        auto_cls = AutoModelForImageTextToText
    return _from_pretrained(auto_cls, path, cfg, dev.resolve_dtype(dtype), trust_remote_code, field)


def load_processor(path: str, trust_remote_code: bool = False, custom_chat_template: str | None = None,
                   field: str = "actor_rollout_ref.model.path"):
    """The multimodal processor of a vision-language checkpoint, or ``None`` for a text-only one.

    Works without torchvision (``utils/hf_processor.py``); ``custom_chat_template`` replaces the processor's
    chat template as it does the tokenizer's.
    """
    from hybridflow.utils.hf_processor import load_processor as _load

    src = _resolve_path(path, field)
    try:
        processor = _load(src, trust_remote_code)
    except (OSError, ValueError, ImportError) as e:
        raise ModelLoadError(f"cannot load the multimodal processor of {field}={path!r}: {e}") from e
    if processor is not None and custom_chat_template:
        processor.chat_template = custom_chat_template
    return processor


def load_value_model(
    path: str,
    dtype: str | torch.dtype | None = "fp32",
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    field: str = "critic.model.path",
):
    """Critic: causal-LM backbone + freshly initialised scalar head (token classification, 1 label).

    Dropout on the head is switched off (``classifier_dropout=0``) so values are deterministic
    and the recomputed values in ``update_critic`` match ``compute_values``.
    """
    from transformers import AutoModelForTokenClassification

    overrides = {"num_labels": 1, "classifier_dropout": 0.0, **dict(override_config or {})}
    cfg = load_hf_config(path, trust_remote_code, overrides, field)
    return _from_pretrained(AutoModelForTokenClassification, path, cfg, dev.resolve_dtype(dtype), trust_remote_code, field)


def load_reward_model(
    path: str,
    dtype: str | torch.dtype | None = "fp32",
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    field: str = "reward_model.model.path",
):
    """Sequence-classification reward model with one output (the scalar score)."""
    from transformers import AutoModelForSequenceClassification

    overrides = {"num_labels": 1, **dict(override_config or {})}
    cfg = load_hf_config(path, trust_remote_code, overrides, field)
    model = _from_pretrained(AutoModelForSequenceClassification, path, cfg, dev.resolve_dtype(dtype), trust_remote_code, field)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = model.config.eos_token_id
    return model


def _as_target_modules(target_modules: str | Iterable[str] | None) -> Any:
    if target_modules is None:
        return "all-linear"
    if isinstance(target_modules, str):
        return target_modules  # "all-linear" or a regex, both understood by peft
    return list(target_modules)


def apply_lora(
    model,
    lora_rank: int,
    lora_alpha: float,
    target_modules: str | Iterable[str] | None = "all-linear",
    exclude_modules: str | Iterable[str] | None = None,
    task_type: str = "CAUSAL_LM",
    options: LoraOptions | None = None,
):
    """Wrap ``model`` with peft LoRA adapters (Hu et al. 2021, arXiv:2106.09685).

    ``options`` (verl's Megatron ``lora`` node, ``engine/lora_options.py``): dropout, DoRA and how A and B start.

    Only adapter weights are trainable afterwards; ``with model.disable_adapter():`` gives the base
    model back, which is how the reference policy is computed without a second copy of the weights.
    On a vision-language model the adapters go on the language model only: the vision tower's linear
    layers are added to the exclusions (train the tower, or not, with ``actor.freeze_vision_tower``).
    """
    if lora_rank <= 0:
        raise ValueError(f"lora_rank must be > 0 to apply LoRA, got {lora_rank}")
    from peft import LoraConfig, get_peft_model

    exclude = _as_target_modules(exclude_modules) if exclude_modules else None
    vision = vision_linear_names(model)
    if vision:
        if isinstance(exclude, str):  # a regex: either it or a vision-tower layer
            exclude = "|".join([f"(?:{exclude})"] + [f"(?:{re.escape(n)})" for n in vision])
        else:
            exclude = list(exclude or []) + vision
    options = options or LoraOptions()
    cfg = LoraConfig(
        r=int(lora_rank),
        lora_alpha=float(lora_alpha),
        target_modules=_as_target_modules(target_modules),
        exclude_modules=exclude,
        bias="none",
        task_type=task_type,
        lora_dropout=options.dropout,
        use_dora=options.use_dora,
    )
    model = get_peft_model(model, cfg)
    init_adapters(model, options)
    return model


def read_adapter_config(adapter_path: str, field: str = "actor_rollout_ref.model.lora_adapter_path") -> dict:
    """``adapter_config.json`` of a saved PEFT adapter folder (what ``PeftModel.save_pretrained`` writes)."""
    import json

    path = os.path.join(os.path.expanduser(adapter_path), "adapter_config.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{field}={adapter_path!r} holds no adapter_config.json; point it at a folder written by "
                             "PeftModel.save_pretrained (e.g. <checkpoint>/actor/huggingface/lora_adapter)")
    with open(path) as f:
        return json.load(f)


def load_lora_adapter(model, adapter_path: str, field: str = "actor_rollout_ref.model.lora_adapter_path"):
    """Wrap ``model`` with a *saved* LoRA adapter, trainable (verl's ``model.lora_adapter_path``).

    The adapter's own ``adapter_config.json`` decides rank, alpha and target modules (``lora_rank`` /
    ``lora_alpha`` / ``target_modules`` are not used), as in verl.  ``disable_adapter()`` still gives the base
    model back, so the reference policy stays the base model the adapter was trained from.
    """
    from peft import PeftModel

    cfg = read_adapter_config(adapter_path, field)
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelLoadError(f"{field}={adapter_path!r} is a {cfg.get('peft_type')} adapter; only LoRA adapters load here")
    return PeftModel.from_pretrained(model, os.path.expanduser(adapter_path), is_trainable=True)


def enable_gradient_checkpointing(model) -> None:
    """Recompute activations in backward (non-reentrant, so frozen inputs such as LoRA bases work)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(model, "config"):
        model.config.use_cache = False
