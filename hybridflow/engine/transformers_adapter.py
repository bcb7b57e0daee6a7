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
  (:func:`forward_with_cache` passes the one the model's class takes, so no deprecation warning fires; it also
  turns a MoE config's ``output_router_logits`` off for the call, whose auxiliary loss cannot read a 4-D mask);
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
  :func:`decoder_stack`), and the head counts of the text config (:func:`attention_head_counts`);
* **sliding windows** -- which layers attend over a window, and how a model takes per-layer-type masks
  (:func:`attention_mask_layout`): a model whose config lists ``layer_types`` (Qwen2/Qwen3 with
  ``use_sliding_window``, Gemma-2) takes ``attention_mask`` as a ``{layer type: 4-D mask}`` dict, as
  ``generate`` hands it; one without (Mistral, Mixtral, Qwen3-MoE) applies ``config.sliding_window`` to every
  layer through its single mask.  A 4-D mask is used as given, so the engine must build the windows into it;
* **sdpa support** -- ``_supports_sdpa`` on the model class the auto class maps a config to (Gemma-2: no, its
  attention soft-capping needs ``eager``; :func:`loadable_attention`);
* **MoE routers** -- the modules whose outputs transformers records as ``router_logits``
  (``_can_record_outputs``) return ``(router_logits, top-k weights, top-k expert ids)``
  (:func:`router_modules`).
"""

from __future__ import annotations

import contextvars

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = [
    "EAGER_PREFIX",
    "ExpertsLayout",
    "LayerSplit",
    "AttentionMaskLayout",
    "TransformersAdapterError",
    "decoder_layer_split",
    "embedding_and_head",
    "unwrap_peft",
    "is_linear",
    "moe_experts",
    "attention_head_counts",
    "attention_implementation",
    "attention_mask_layout",
    "cache_argument",
    "causal_lm_model_types",
    "check_cache_object",
    "decoder_stack",
    "forward_with_cache",
    "loadable_attention",
    "register_eager_attention",
    "reset_rope_deltas",
    "router_modules",
    "supports_sdpa",
    "text_config",
    "transformers_version",
    "use_attention_implementation",
    "wrap_attention_function",
    "wrap_mask_function",
]

_CACHE_ARGUMENTS = ("cache", "past_key_values")


class TransformersAdapterError(TypeError):
    """transformers no longer does what hybridflow relies on (the message says what and which version)."""


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def unwrap_peft(model: nn.Module) -> nn.Module:
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
    return _cache_argument_of(type(unwrap_peft(model)))


def forward_with_cache(model: nn.Module, cache: Any, **kwargs: Any) -> Any:
    """``model(**kwargs)`` with ``cache`` passed under the argument name this transformers release uses.

    A MoE model whose config switches ``output_router_logits`` on (to train with the router's auxiliary loss)
    would also compute that loss here, from the caller's 4-D mask, which it cannot read: generation asks for no
    router logits."""
    kwargs[cache_argument(model)] = cache
    if getattr(text_config(getattr(model, "config", None)), "output_router_logits", False):
        kwargs.setdefault("output_router_logits", False)
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


@functools.lru_cache(maxsize=None)
def forward_parameters(cls: type) -> tuple[frozenset[str], bool]:
    """The named parameters of ``cls.forward`` and whether it also takes ``**kwargs`` (which transformers' models
    hand down to every attention call), read once per model class."""
    params = inspect.signature(cls.forward).parameters.values()
    names = frozenset(p.name for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD)
    return names, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


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
    inner = getattr(unwrap_peft(model), "model", None)
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
    base = unwrap_peft(model)
    get = getattr(base, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is None or not hasattr(decoder, "layers"):
        raise TransformersAdapterError(
            f"{type(base).__name__} (transformers {transformers_version()}): get_decoder() does not return a module "
            "with decoder layers, so its input sequence cannot be split for sequence parallelism")
    return decoder


# (kind, name) -> tags of the wrappers installed (several engines in one process install each once)
_WRAPPED: dict[tuple[str, str], set[str]] = {}


def _wrap(kind: str, interface: Any, name: str, make_wrapper, tag: str) -> bool:
    tags = _WRAPPED.setdefault((kind, name), set())  # wrappers of several tags nest; each tag wraps once
    if tag in tags:
        return True
    mapping = interface._global_mapping
    if name not in mapping:
        return False
    type(interface).register(name, make_wrapper(mapping[name]))
    tags.add(tag)
    return True


def wrap_attention_function(name: str, make_wrapper, tag: str) -> bool:
    """Replace transformers' attention function ``name`` (``sdpa``, ``flash_attention_2``, ...) by
    ``make_wrapper(original)``, through the public ``AttentionInterface.register``; once per ``tag``.  The wrapper
    must behave as ``original`` for calls it does not handle.  Returns False when ``name`` is not registered."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return _wrap("attention", ALL_ATTENTION_FUNCTIONS, name, make_wrapper, tag)


EAGER_PREFIX = "hybridflow_eager_"  # names register_eager_attention gives models' eager attention functions


def register_eager_attention(module: nn.Module) -> str:
    """Give ``module``'s eager attention (its modeling file's ``eager_attention_forward``, run by models with no
    sdpa path such as Gemma-2) a name in transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` (the
    eager mask builder), so a wrapper can be installed over it as over ``sdpa``; returns the name.  The model keeps
    running it: switch with :func:`use_attention_implementation`."""
    import sys

    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attention = next((m for m in module.modules() if hasattr(m, "is_causal") and hasattr(m, "head_dim")), None)
    source = sys.modules.get(type(attention).__module__) if attention is not None else None
    eager = getattr(source, "eager_attention_forward", None)
    if eager is None:
        raise TransformersAdapterError(
            f"{type(module).__name__} (transformers {transformers_version()}): no eager_attention_forward found in its "
            "modeling file for its eager attention")
    name = EAGER_PREFIX + type(attention).__module__.rsplit(".", 1)[-1].removeprefix("modeling_")
    if name not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        type(ALL_ATTENTION_FUNCTIONS).register(name, eager)
        type(ALL_MASK_ATTENTION_FUNCTIONS).register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["eager"])
    return name


def use_attention_implementation(module: nn.Module, name: str) -> None:
    """Make ``module`` (and the sub-configs its attention reads) run the registered attention ``name``."""
    for config in {id(c): c for c in (module.config, text_config(module.config))}.values():
        config._attn_implementation = name


def wrap_mask_function(name: str, make_wrapper, tag: str) -> bool:
    """The same for the mask builder of attention implementation ``name`` (``AttentionMaskInterface``)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return _wrap("mask", ALL_MASK_ATTENTION_FUNCTIONS, name, make_wrapper, tag)


def no_mask_while(active: contextvars.ContextVar[bool]):
    """A ``make_wrapper`` for :func:`wrap_mask_function`: the mask builder returns no mask while ``active`` is true
    (a forward whose attention wrapper needs none) and is the wrapped builder otherwise."""

    def make(original):
        def mask(*args, **kwargs):
            if active.get():
                return None
            return original(*args, **kwargs)

        mask.__wrapped__ = original
        return mask

    return make


# ---------------------------------------------------------------------------------------------- N-D parallelism
# Tensor parallelism splits a decoder layer's projections by *name*; expert parallelism replaces the forward of a
# MoE layer's experts module.  What those names and that forward are is transformers' business, so it is read
# here (contract tests: tests/engine/test_transformers_adapter.py, the TP/EP equality tests in
# tests/engine/test_tensor_parallel.py).  A module this table does not name stays replicated on every tp rank,
# which is always correct (only its memory is not split).

@dataclass(frozen=True)
class LayerSplit:
    """How one decoder layer splits over tensor-parallel ranks (names relative to the layer).

    ``colwise``: ``nn.Linear`` modules whose output features (attention heads, MLP columns) are split;
    ``rowwise``: the ones whose input features are split (their outputs are summed over the group);
    ``head_norms``: norms applied per attention head after a colwise projection (Qwen3's ``q_norm``/``k_norm``):
    their weights stay whole on every rank and their gradients are summed over the group;
    ``experts``: the MoE layer's experts module (3-D weights, see :func:`moe_experts`), or ``None``;
    ``shared_columns``: ``(module, first column)`` of whole modules whose output columns from ``first column`` on
    feed every head directly (the rotary key of DeepSeek's latent attention, one head broadcast to all): each rank
    back-propagates only its heads' share into them, so their gradient must be summed over the group.
    """

    colwise: tuple[str, ...]
    rowwise: tuple[str, ...]
    head_norms: tuple[str, ...] = ()
    experts: str | None = None
    shared_columns: tuple[tuple[str, int], ...] = ()


_STANDARD_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


def is_linear(module: Any) -> bool:
    """An ``nn.Linear``, or one wrapped by a LoRA adapter layer (peft keeps it as ``base_layer``)."""
    return isinstance(module, nn.Linear) or isinstance(getattr(module, "base_layer", None), nn.Linear)


def _mlp_split(prefix: str, mlp: nn.Module) -> tuple[list[str], list[str]]:
    if all(is_linear(getattr(mlp, n, None)) for n in _DENSE_MLP):
        return [f"{prefix}.gate_proj", f"{prefix}.up_proj"], [f"{prefix}.down_proj"]
    return [], []


def decoder_layer_split(layer: nn.Module) -> LayerSplit:
    """The tensor-parallel split of a decoder layer of the supported families: standard multi-head / grouped-query
    attention (Qwen2, Qwen2.5, Qwen3, Llama, Mistral, Qwen3-MoE), DeepSeek's multi-head latent attention (the
    up-projections ``q_b_proj``/``q_proj`` and ``kv_b_proj`` are split, the low-rank down-projections stay whole),
    gated MLPs, and MoE blocks (router whole, experts via :func:`moe_experts`, shared experts split like an MLP)."""
    attn = getattr(layer, "self_attn", None)
    if attn is None:
        raise TransformersAdapterError(f"{type(layer).__name__} has no self_attn module: tensor parallelism does not "
                                       "know how to split its attention")
    if all(is_linear(getattr(attn, n, None)) for n in _STANDARD_ATTENTION):
        colwise = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
        rowwise = ["self_attn.o_proj"]
        norms = tuple(f"self_attn.{n}" for n in ("q_norm", "k_norm") if getattr(attn, n, None) is not None)
        shared = ()
    elif is_linear(getattr(attn, "kv_b_proj", None)) and is_linear(getattr(attn, "o_proj", None)):
        q = "q_b_proj" if is_linear(getattr(attn, "q_b_proj", None)) else "q_proj"
        colwise, rowwise, norms = [f"self_attn.{q}", "self_attn.kv_b_proj"], ["self_attn.o_proj"], ()
        # kv_a_proj_with_mqa's output is [latent (kv_lora_rank) | rotary key (qk_rope_head_dim)]: the latent goes
        # through kv_b_proj (split by heads), the rotary key is expanded to every head as is
        shared = (("self_attn.kv_a_proj_with_mqa", int(attn.kv_lora_rank)),)
    else:
        raise TransformersAdapterError(
            f"{type(attn).__name__} (transformers {transformers_version()}) has neither q/k/v/o projections nor "
            "DeepSeek's latent-attention projections: tensor parallelism cannot split it")
    mlp = getattr(layer, "mlp", None)
    experts = None
    if mlp is not None:
        col, row = _mlp_split("mlp", mlp)
        colwise += col
        rowwise += row
        if not col and _is_experts(getattr(mlp, "experts", None)):
            experts = "mlp.experts"
            for name in ("shared_experts", "shared_expert"):
                sub = getattr(mlp, name, None)
                if sub is not None:
                    col, row = _mlp_split(f"mlp.{name}", sub)
                    colwise += col
                    rowwise += row
    return LayerSplit(tuple(colwise), tuple(rowwise), norms, experts, shared)


def _is_experts(module: Any) -> bool:
    if not isinstance(module, nn.Module):
        return False
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gu, nn.Parameter) and isinstance(down, nn.Parameter) and gu.dim() == 3 and down.dim() == 3
            and callable(getattr(module, "act_fn", None)))


@dataclass(frozen=True)
class ExpertsLayout:
    """A MoE experts module as transformers 5 stores it: ``gate_up_proj`` (E, 2 I, H) with the gate projection in
    rows [0, I) and the up projection in rows [I, 2 I) of each expert, ``down_proj`` (E, H, I), ``act_fn``; its
    forward is ``forward(hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)`` and computes
    ``sum_j w_j * down_e(act(gate_e(x)) * up_e(x))`` over a token's k experts e = top_k_index[:, j] (dropless:
    every token reaches all its experts, there is no capacity limit)."""

    num_experts: int
    hidden: int
    intermediate: int


def moe_experts(model: nn.Module) -> list[tuple[str, nn.Module, ExpertsLayout]]:
    """Every experts module of ``model`` (Qwen3-MoE, DeepSeek-V3, Qwen2-MoE, Mixtral in transformers 5), with its
    layout; ``[]`` for a dense model."""
    out = []
    for name, module in unwrap_peft(model).named_modules():
        if _is_experts(module):
            e, two_i, h = module.gate_up_proj.shape
            if two_i % 2 or tuple(module.down_proj.shape) != (e, h, two_i // 2):
                raise TransformersAdapterError(
                    f"{name} ({type(module).__name__}): gate_up_proj {tuple(module.gate_up_proj.shape)} and down_proj "
                    f"{tuple(module.down_proj.shape)} are not the (E, 2I, H) / (E, H, I) layout expert parallelism reads")
            out.append((name, module, ExpertsLayout(int(e), int(h), int(two_i // 2))))
    return out


def embedding_and_head(model: nn.Module) -> tuple[str, str | None, bool]:
    """(name of the input embedding, name of the LM head or ``None`` (a critic / reward model's score head is not a
    vocabulary projection), whether the two share their weight) -- through ``get_input_embeddings`` /
    ``get_output_embeddings``."""
    base = unwrap_peft(model)
    emb, head = base.get_input_embeddings(), base.get_output_embeddings()
    names = {id(m): n for n, m in base.named_modules()}
    if emb is None or id(emb) not in names:
        raise TransformersAdapterError(f"{type(base).__name__}: get_input_embeddings() returns no submodule")
    if not isinstance(emb, nn.Embedding):
        raise TransformersAdapterError(f"{type(base).__name__}'s input embedding is a {type(emb).__name__}, not an "
                                       "nn.Embedding: it cannot be split over the vocabulary")
    head_name = names.get(id(head)) if isinstance(head, nn.Linear) else None
    tied = head_name is not None and head.weight is emb.weight
    return names[id(emb)], head_name, tied


FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_ALL_LAYERS = "all_layers"


@dataclass(frozen=True)
class AttentionMaskLayout:
    """How a decoder's layers attend, for a caller that builds its own 4-D masks.

    ``windows``: mask name -> sliding window in tokens (``None``: full causal).  A key may attend to a query
    ``window`` positions back at most: key position ``k`` is visible from query position ``q`` iff
    ``k <= q`` and ``q - k < window`` (transformers' ``sliding_window_overlay``).
    ``keyed``: pass the masks as a ``{name: mask}`` dict (the model routes each layer to its type's mask);
    else pass the one mask of ``windows`` (its single entry applies to every layer).
    ``layer_keys``: the mask name of every layer, in order.
    ``unsupported``: why these layers cannot be served with additive masks (then the other fields are moot).
    """

    windows: dict[str, int | None]
    keyed: bool
    layer_keys: tuple[str, ...]
    unsupported: str | None = None

    @property
    def has_windows(self) -> bool:
        return any(w is not None for w in self.windows.values())


def attention_mask_layout(config: Any) -> AttentionMaskLayout:
    """The sliding windows of ``config``'s decoder layers and how its forward takes per-layer masks."""
    cfg = text_config(config)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types:
        kinds = tuple(str(t) for t in layer_types)
        odd = sorted(set(kinds) - {FULL_ATTENTION, SLIDING_ATTENTION})
        if odd:
            return AttentionMaskLayout({}, False, kinds, f"layer types {odd} (only {FULL_ATTENTION} and "
                                                         f"{SLIDING_ATTENTION} layers take additive masks)")
        if SLIDING_ATTENTION in kinds and not window:
            return AttentionMaskLayout({}, False, kinds, "sliding_attention layers without a sliding_window size")
        windows = {k: (int(window) if k == SLIDING_ATTENTION else None) for k in dict.fromkeys(kinds)}
        return AttentionMaskLayout(windows, SLIDING_ATTENTION in windows, kinds)
    if window is not None:  # Mistral / Mixtral / Qwen3-MoE: one mask function, the window on every layer
        return AttentionMaskLayout({_ALL_LAYERS: int(window)}, False, (_ALL_LAYERS,) * layers)
    return AttentionMaskLayout({_ALL_LAYERS: None}, False, (_ALL_LAYERS,) * layers)


def supports_sdpa(model_or_class: Any) -> bool:
    """Whether transformers runs this model class with ``attn_implementation="sdpa"`` (``from_pretrained``
    refuses sdpa for a class that declares ``_supports_sdpa = False``, e.g. Gemma-2)."""
    cls = model_or_class if isinstance(model_or_class, type) else type(unwrap_peft(model_or_class))
    return bool(getattr(cls, "_supports_sdpa", True))


def loadable_attention(auto_cls: type, config: Any, wanted: str) -> str:
    """The attention implementation to load ``config`` with through ``auto_cls`` (an ``AutoModelFor...``):
    ``wanted``, except ``eager`` where ``wanted`` is ``sdpa`` and the class the auto class picks has no sdpa
    path (Gemma-2's attention soft-capping).  A class the auto mapping does not know (remote code) keeps
    ``wanted``: ``from_pretrained`` then says what it supports."""
    if wanted != "sdpa":
        return wanted
    from transformers.models.auto.auto_factory import _get_model_class

    try:
        cls = _get_model_class(config, auto_cls._model_mapping)
    except (KeyError, AttributeError, TypeError, ValueError):
        return wanted
    return wanted if supports_sdpa(cls) else "eager"


def router_modules(model: nn.Module) -> list[nn.Module]:
    """The MoE router (gate) modules of ``model``, in layer order: the class transformers records
    ``router_logits`` from (``_can_record_outputs``).  Each returns ``(router_logits (N, E), top-k weights
    (N, k), top-k expert ids (N, k))`` for the N tokens of a forward.  Empty for a dense model."""
    base = unwrap_peft(model)
    router_cls = None
    for module in base.modules():
        spec = (getattr(type(module), "_can_record_outputs", None) or {}).get("router_logits")
        target = getattr(spec, "target_class", None)
        if isinstance(target, type):
            router_cls = target
            break
    if router_cls is None:
        return []
    return [m for m in base.modules() if isinstance(m, router_cls)]
