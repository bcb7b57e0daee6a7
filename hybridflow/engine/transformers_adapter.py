"""Everything hybridflow relies on from transformers beyond its documented ``from_pretrained`` / ``forward`` API.

transformers changes its internals between minor releases (5.24 renamed the forward's ``past_key_values``
argument to ``cache`` and started calling ``cache.update(k, v, layer_idx, kwargs=...)``).  The ``hf`` rollout
engine hands the model its own cache object and its own 4-D masks, the fast decode step reads decoder
modules directly, and the training forward picks a layout from the attention implementation.  Those
assumptions are made here, and only here, so that a release that breaks one of them breaks one module whose
tests (``tests/engine/test_transformers_adapter.py``) say which assumption no longer holds:

* **the cache protocol** -- an attention layer calls ``cache.update(key_states, value_states, layer_idx, ...)``
  (extra positional or keyword arguments vary by release: ``cache_kwargs``, ``kwargs=``) and attends over the
  two tensors it returns; a 4-D additive mask given as ``attention_mask`` is used as is;
* **the cache argument** of ``forward`` -- ``cache`` from 5.24, ``past_key_values`` before
  (:func:`forward_with_cache` passes the one the model's class takes, so no deprecation warning fires);
* **the attention implementation** -- ``config._attn_implementation`` of the text config;
* **the model classes** -- ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` says which ``model_type`` loads as a causal LM;
* **M-RoPE state** -- Qwen2-VL-family models keep ``rope_deltas`` on their inner model between calls
  (:func:`reset_rope_deltas`);
* **the attention and mask interfaces** (Ulysses sequence parallelism, ``engine/ulysses.py``) -- attention modules
  look their function up in ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` at every call and pass it
  ``(module, query (B, H, S, D), key, value, attention_mask, **kwargs)`` with the keyword arguments the decoder
  stack was called with; the decoder builds its mask with ``ALL_MASK_ATTENTION_FUNCTIONS[...]`` and hands a
  ``None`` mask on as is (:func:`wrap_attention_function`, :func:`wrap_mask_function`);
* **the decoder stack** -- the module that embeds, runs the layers and is called with ``input_ids`` or
  ``inputs_embeds`` and ``position_ids`` as keywords (a VLM's language model after the image features are merged;
  :func:`decoder_stack`), and the head counts of the text config (:func:`attention_head_counts`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch import nn

__all__ = [
    "TransformersAdapterError",
    "attention_head_counts",
    "attention_implementation",
    "cache_argument",
    "causal_lm_model_types",
    "check_cache_object",
    "decoder_stack",
    "forward_with_cache",
    "reset_rope_deltas",
    "text_config",
    "transformers_version",
    "wrap_attention_function",
    "wrap_mask_function",
]

_CACHE_ARGUMENTS = ("cache", "past_key_values")


class TransformersAdapterError(TypeError):
    """transformers no longer does what hybridflow relies on (the message says what and which version)."""


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def _base_model(model: nn.Module) -> nn.Module:
    """The transformers model under wrappers whose ``forward`` only forwards ``**kwargs`` (PEFT)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@functools.lru_cache(maxsize=None)
def _cache_argument_of(cls: type) -> str:
    params = inspect.signature(cls.forward).parameters
    for name in _CACHE_ARGUMENTS:
        if name in params:
            return name
    raise TransformersAdapterError(
        f"{cls.__name__}.forward (transformers {transformers_version()}) takes none of {_CACHE_ARGUMENTS}: the hf "
        "engine cannot hand it a KV cache; use a transformers release in hybridflow's tested range (README)")


def cache_argument(model: nn.Module) -> str:
    """The name under which ``model``'s forward takes a KV cache object."""
    return _cache_argument_of(type(_base_model(model)))


def forward_with_cache(model: nn.Module, cache: Any, **kwargs: Any) -> Any:
    """``model(**kwargs)`` with ``cache`` passed under the argument name this transformers release uses."""
    kwargs[cache_argument(model)] = cache
    return model(**kwargs)


def check_cache_object(cache: Any) -> None:
    """Refuse, before any forward, a cache object whose ``update`` cannot take transformers' call.

    Attention layers call ``update(key_states, value_states, layer_idx, <release-specific extras>)``; a cache
    that cannot accept the extras would raise inside the forward, on the engine's thread, in the middle of
    a batch.  Checked once per cache object instead.
    """
    update = getattr(cache, "update", None)
    if not callable(update):
        raise TransformersAdapterError(f"{type(cache).__name__} has no update(): not a KV cache object")
    kinds = {p.kind for p in inspect.signature(update).parameters.values()}
    if not {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds:
        raise TransformersAdapterError(
            f"{type(cache).__name__}.update{inspect.signature(update)} cannot take the call transformers "
            f"{transformers_version()} makes, update(key_states, value_states, layer_idx, *args, **kwargs)")


def text_config(config: Any) -> Any:
    """The language model's config (a VLM's ``text_config``; the config itself otherwise)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def attention_implementation(config: Any, default: str = "sdpa") -> str:
    """The attention backend a loaded model runs (``sdpa``, ``eager``, ``flash_attention_2``, ...)."""
    impl = getattr(text_config(config), "_attn_implementation", None)
    if impl is None:
        impl = getattr(config, "_attn_implementation", None)
    return impl or default


def causal_lm_model_types() -> frozenset[str]:
    """``model_type`` values that ``AutoModelForCausalLM`` loads."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def reset_rope_deltas(model: nn.Module) -> None:
    """Forget the M-RoPE offsets a Qwen2-VL-family model cached during its last ``generate``/forward."""
    inner = getattr(_base_model(model), "model", None)
    if inner is not None and hasattr(inner, "rope_deltas"):
        inner.rope_deltas = None


def attention_head_counts(config: Any) -> tuple[int, int]:
    """(query heads, key/value heads) of the language model."""
    cfg = text_config(config)
    heads = int(cfg.num_attention_heads)
    kv = getattr(cfg, "num_key_value_heads", None)
    return heads, int(kv) if kv is not None else heads


def decoder_stack(model: nn.Module) -> nn.Module:
    """The module that turns ``input_ids``/``inputs_embeds`` + ``position_ids`` into hidden states through the
    decoder layers (``Qwen2Model`` of a ``Qwen2ForCausalLM`` or a token-classification critic; the language model
    of a Qwen2-VL).  transformers' ``get_decoder`` finds it on every model family it knows."""
    base = _base_model(model)
    get = getattr(base, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is None or not hasattr(decoder, "layers"):
        raise TransformersAdapterError(
            f"{type(base).__name__} (transformers {transformers_version()}): get_decoder() does not return a module "
            "with decoder layers, so its input sequence cannot be split for sequence parallelism")
    return decoder


# name -> tag of the wrapper installed (so several engines in one process install it once)
_WRAPPED: dict[tuple[str, str], str] = {}


def _wrap(kind: str, interface: Any, name: str, make_wrapper, tag: str) -> bool:
    if _WRAPPED.get((kind, name)) == tag:
        return True
    mapping = interface._global_mapping
    if name not in mapping:
        return False
    type(interface).register(name, make_wrapper(mapping[name]))
    _WRAPPED[(kind, name)] = tag
    return True


def wrap_attention_function(name: str, make_wrapper, tag: str) -> bool:
    """Replace transformers' attention function ``name`` (``sdpa``, ``flash_attention_2``, ...) by
    ``make_wrapper(original)``, through the public ``AttentionInterface.register``; once per ``tag``.  The wrapper
    must behave as ``original`` for calls it does not handle.  Returns False when ``name`` is not registered."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return _wrap("attention", ALL_ATTENTION_FUNCTIONS, name, make_wrapper, tag)


def wrap_mask_function(name: str, make_wrapper, tag: str) -> bool:
    """The same for the mask builder of attention implementation ``name`` (``AttentionMaskInterface``)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return _wrap("mask", ALL_MASK_ATTENTION_FUNCTIONS, name, make_wrapper, tag)
