"""Each assumption ``hybridflow.engine.transformers_adapter`` makes about transformers, checked against the
installed release.  A new release that changes one of them fails here, naming the assumption, instead of
breaking (or hanging) the ``hf`` engine somewhere downstream."""

from __future__ import annotations

import warnings

import pytest
import torch

from hybridflow.engine import transformers_adapter as tfa
from hybridflow.rollout.hf.kv_cache import SlotKVCache
from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

ARCHS = ["qwen2", "llama", "qwen3", "mistral"]


class RecordingCache:
    """A duck-typed cache like the engine's: records every update call and returns what it is told to."""

    def __init__(self, replace_values: torch.Tensor | None = None):
        self.calls: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = []
        self.replace_values = replace_values

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.calls.append((layer_idx, tuple(key_states.shape), tuple(value_states.shape), len(args) + len(kwargs)))
        if self.replace_values is not None:
            value_states = torch.zeros_like(value_states)
        return key_states, value_states


@pytest.fixture(scope="module", params=ARCHS)
def model(request):
    tok = build_char_tokenizer()
    return build_tiny_model(tok, size="nano", arch=request.param).eval()


def _inputs(model, batch=2, length=5):
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (batch, length))
    positions = torch.arange(length)[None].expand(batch, -1)
    causal = torch.full((length, length), float("-inf")).triu(1)
    return ids, positions, causal[None, None].expand(batch, 1, -1, -1).clone()


def test_forward_takes_a_cache_argument_without_deprecation_warning(model):
    name = tfa.cache_argument(model)
    assert name in ("cache", "past_key_values")
    ids, positions, mask = _inputs(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated argument name would raise here
        tfa.forward_with_cache(model, RecordingCache(), input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True)


def test_attention_layers_call_update_once_per_layer_with_k_v_layer_idx(model):
    cache = RecordingCache()
    ids, positions, mask = _inputs(model, batch=2, length=5)
    with torch.no_grad():
        tfa.forward_with_cache(model, cache, input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True)
    cfg = tfa.text_config(model.config)
    kv_heads = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert [c[0] for c in cache.calls] == list(range(cfg.num_hidden_layers)), "one update per layer, in order"
    for _, k_shape, v_shape, _ in cache.calls:
        assert k_shape == v_shape == (2, kv_heads, 5, head_dim), "K/V as (batch, kv_heads, tokens, head_dim)"


def test_attention_uses_the_tensors_update_returns(model):
    """The engine's cache returns the cached columns to attend over: attention must read what update returns."""
    ids, positions, mask = _inputs(model)
    with torch.no_grad():
        plain = tfa.forward_with_cache(model, RecordingCache(), input_ids=ids, attention_mask=mask,
                                       position_ids=positions, use_cache=True).logits
        zeroed = tfa.forward_with_cache(model, RecordingCache(replace_values=torch.zeros(())), input_ids=ids,
                                        attention_mask=mask, position_ids=positions, use_cache=True).logits
    assert not torch.allclose(plain, zeroed), "the values update() returned were ignored"


def test_a_4d_additive_mask_is_used_as_given(model):
    """The engine builds its own (B, 1, q, kv) additive masks; transformers must not rebuild them."""
    ids, positions, mask = _inputs(model, batch=1, length=5)
    blocked = mask.clone()
    blocked[..., 4, 1] = float("-inf")  # the last query may not see token 1
    with torch.no_grad():
        a = tfa.forward_with_cache(model, RecordingCache(), input_ids=ids, attention_mask=mask,
                                   position_ids=positions, use_cache=True).logits
        b = tfa.forward_with_cache(model, RecordingCache(), input_ids=ids, attention_mask=blocked,
                                   position_ids=positions, use_cache=True).logits
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4], b[:, 4]), "a masked column did not change the output: mask rebuilt"


def test_explicit_position_ids_are_used(model):
    """Rotary positions only matter relative to each other: a gap in the middle must change the output."""
    ids, positions, mask = _inputs(model, batch=1, length=5)
    gapped = positions.clone()
    gapped[:, 3:] += 7
    with torch.no_grad():
        a = tfa.forward_with_cache(model, RecordingCache(), input_ids=ids, attention_mask=mask,
                                   position_ids=positions, use_cache=True).logits
        b = tfa.forward_with_cache(model, RecordingCache(), input_ids=ids, attention_mask=mask,
                                   position_ids=gapped, use_cache=True).logits
    torch.testing.assert_close(a[:, :3], b[:, :3])
    assert not torch.allclose(a, b), "position_ids were ignored"


def test_the_engine_cache_matches_the_protocol_and_a_wrong_one_is_refused():
    tfa.check_cache_object(SlotKVCache(2, 8, torch.float32, torch.float32, torch.device("cpu")))
    tfa.check_cache_object(RecordingCache())

    class OldStyle:
        def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
            return key_states, value_states

    with pytest.raises(TypeError, match=r"cannot take the call transformers"):
        tfa.check_cache_object(OldStyle())
    with pytest.raises(TypeError, match="no update"):
        tfa.check_cache_object(object())


def test_attention_implementation_and_text_config(model, tiny_vlm_dir):
    from transformers import AutoConfig

    assert tfa.attention_implementation(model.config) in ("sdpa", "eager")
    vlm = AutoConfig.from_pretrained(tiny_vlm_dir)
    assert tfa.text_config(vlm) is not vlm and hasattr(tfa.text_config(vlm), "num_hidden_layers")
    assert tfa.text_config(model.config) is model.config


def test_causal_lm_model_types_cover_the_supported_families():
    types = tfa.causal_lm_model_types()
    assert {"qwen2", "qwen3", "llama", "mistral", "gemma2", "qwen3_moe", "deepseek_v3"} <= types
    assert "distilbert" not in types


def test_forward_with_cache_through_a_peft_wrapper():
    from peft import LoraConfig, get_peft_model

    tok = build_char_tokenizer()
    peft_model = get_peft_model(build_tiny_model(tok, size="nano"), LoraConfig(r=2, target_modules=["q_proj"]))
    assert tfa.cache_argument(peft_model) == tfa.cache_argument(peft_model.get_base_model())
    ids, positions, mask = _inputs(peft_model.get_base_model())
    cache = RecordingCache()
    with torch.no_grad():
        tfa.forward_with_cache(peft_model, cache, input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=True)
    assert cache.calls, "the cache handed through the PEFT wrapper was never used"


def test_qwen2_vl_keeps_rope_deltas_on_its_inner_model(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText

    vlm = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    assert hasattr(vlm.model, "rope_deltas"), "Qwen2-VL no longer caches rope_deltas on model.model"
    vlm.model.rope_deltas = torch.ones(1, 1)
    tfa.reset_rope_deltas(vlm)
    assert vlm.model.rope_deltas is None


# ------------------------------------------------------------------ Ulysses: attention / mask interfaces, decoder
@pytest.fixture
def wrapped_sdpa():
    """Wrap ``sdpa`` (and its mask builder) with recorders for one test, then put transformers' own back."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    saved_attn = ALL_ATTENTION_FUNCTIONS._global_mapping["sdpa"]
    saved_mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"]
    saved_tags = {key: set(tags) for key, tags in tfa._WRAPPED.items()}
    calls: list[dict] = []

    def make_attention(original):
        def attention(module, query, key, value, attention_mask, **kwargs):
            calls.append({"query": tuple(query.shape), "key": tuple(key.shape), "mask": attention_mask,
                          "marker": kwargs.pop("test_marker", None)})
            return original(module, query, key, value, attention_mask, **kwargs)
        return attention

    def make_mask(original):
        return lambda *a, **k: None

    try:
        yield calls, lambda mask=False: (tfa.wrap_attention_function("sdpa", make_attention, "test"),
                                         mask and tfa.wrap_mask_function("sdpa", make_mask, "test"))
    finally:
        ALL_ATTENTION_FUNCTIONS._global_mapping["sdpa"] = saved_attn
        ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"] = saved_mask
        tfa._WRAPPED.clear()
        tfa._WRAPPED.update(saved_tags)


def _marker_hook(decoder, marker):
    def hook(_module, args, kwargs):
        kwargs["test_marker"] = marker
        return args, kwargs
    return decoder.register_forward_pre_hook(hook, with_kwargs=True)


def test_a_wrapped_attention_function_gets_every_call_and_the_decoders_keywords(model, wrapped_sdpa):
    calls, wrap = wrapped_sdpa
    assert wrap()[0] and not tfa.wrap_attention_function("no_such_attention", lambda f: f, "test")
    assert tfa.wrap_attention_function("sdpa", lambda f: 1 / 0, "test")  # once per tag: not wrapped twice
    ids, positions, _ = _inputs(model, batch=1, length=6)
    handle = _marker_hook(tfa.decoder_stack(model), "here")
    try:
        with torch.no_grad():
            model(input_ids=ids, position_ids=positions, use_cache=False)
    finally:
        handle.remove()
    heads, kv_heads = tfa.attention_head_counts(model.config)
    assert len(calls) == model.config.num_hidden_layers
    assert all(c["marker"] == "here" for c in calls), "a keyword given to the decoder stack no longer reaches attention"
    assert calls[0]["query"][:3] == (1, heads, 6) and calls[0]["key"][:3] == (1, kv_heads, 6)


def test_the_decoders_keywords_reach_attention_again_when_checkpointing_recomputes(wrapped_sdpa):
    calls, wrap = wrapped_sdpa
    model = build_tiny_model(build_char_tokenizer(), size="nano").train()
    from hybridflow.engine.model_loader import enable_gradient_checkpointing

    enable_gradient_checkpointing(model)  # as the engine turns it on
    wrap()
    ids, positions, _ = _inputs(model, batch=1, length=6)
    handle = _marker_hook(tfa.decoder_stack(model), "recomputed")
    try:
        loss = model(input_ids=ids, position_ids=positions, use_cache=False).logits.sum()
    finally:
        handle.remove()
    forward_calls = len(calls)
    loss.backward()
    assert len(calls) == 2 * forward_calls, "gradient checkpointing no longer recomputes attention in backward"
    assert all(c["marker"] == "recomputed" for c in calls)


def test_a_mask_builder_returning_none_gives_attention_no_mask(model, wrapped_sdpa):
    calls, wrap = wrapped_sdpa
    wrap(mask=True)
    ids, _, _ = _inputs(model, batch=1, length=6)
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]])  # two packed sequences: transformers would build a block mask
    with torch.no_grad():
        model(input_ids=ids, position_ids=packed, use_cache=False)
    assert calls and all(c["mask"] is None for c in calls)


def test_decoder_stack_and_its_inputs_as_keywords(tiny_vlm_dir):
    from transformers import AutoModelForImageTextToText, AutoModelForTokenClassification

    tok = build_char_tokenizer()
    lm = build_tiny_model(tok, size="nano").eval()
    critic = AutoModelForTokenClassification.from_config(lm.config)  # passes input_ids positionally
    vlm = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).eval()
    assert tfa.decoder_stack(vlm) is vlm.model.language_model
    assert tfa.attention_head_counts(vlm.config) == (vlm.config.text_config.num_attention_heads,
                                                     vlm.config.text_config.num_key_value_heads)
    for m in (lm, critic):
        seen = {}
        decoder = tfa.decoder_stack(m)
        assert hasattr(decoder, "layers") and decoder is m.model

        def hook(module, args, kwargs):
            import inspect

            seen.update(inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments)

        handle = decoder.register_forward_pre_hook(hook, with_kwargs=True)
        ids, positions, _ = _inputs(m, batch=1, length=4)
        with torch.no_grad():
            m(input_ids=ids, position_ids=positions)
        handle.remove()
        assert torch.equal(seen["input_ids"], ids) and torch.equal(seen["position_ids"], positions)


# ---------------------------------------------------------------------------------------------- N-D parallelism
def _nd_model(family: str):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("hf_test_nd_models", Path(__file__).with_name("nd_models.py"))
    nd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nd)
    return nd.build_model(family)


@pytest.mark.parametrize("family,colwise,rowwise,norms,experts", [
    ("qwen2", {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}, {"o_proj", "down_proj"}, 0, False),
    ("qwen3", {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}, {"o_proj", "down_proj"}, 2, False),
    ("qwen3-moe", {"q_proj", "k_proj", "v_proj"}, {"o_proj"}, 2, True),
    ("deepseek-v3", {"q_b_proj", "kv_b_proj", "gate_proj", "up_proj"}, {"o_proj", "down_proj"}, 0, True),
])
def test_decoder_layer_split_names_modules_that_exist(family, colwise, rowwise, norms, experts):
    """Every name the split gives is a module of that class in the layer (parallelize_module would silently skip a
    missing one); the last layer of the MoE families is a MoE layer."""
    model = _nd_model(family)
    layer = model.model.layers[-1]
    split = tfa.decoder_layer_split(layer)
    assert {n.rsplit(".", 1)[-1] for n in split.colwise} == colwise
    assert {n.rsplit(".", 1)[-1] for n in split.rowwise} >= rowwise
    for name in split.colwise + split.rowwise:
        assert isinstance(layer.get_submodule(name), torch.nn.Linear), name
    assert len(split.head_norms) == norms and all(layer.get_submodule(n) is not None for n in split.head_norms)
    assert (split.experts is not None) == experts
    if family == "deepseek-v3":  # the latent attention's rotary key columns, shared by every head
        (name, first), = split.shared_columns
        assert layer.get_submodule(name).out_features == first + model.config.qk_rope_head_dim


@pytest.mark.parametrize("family", ["qwen3-moe", "deepseek-v3"])
def test_moe_experts_layout_and_forward_contract(family):
    """transformers' experts module computes, for rows grouped by expert, exactly what expert parallelism's
    ``expert_forward`` computes from the (E, 2I, H) / (E, H, I) weights with the gate in the first I rows; routing
    weights multiply each expert's output and a token's k outputs are summed (dropless)."""
    from hybridflow.engine.expert_parallel import expert_forward

    model = _nd_model(family)
    found = tfa.moe_experts(model)
    assert found and all(layout.num_experts == 4 and layout.hidden == 64 for _, _, layout in found)
    _, experts, layout = found[-1]
    torch.manual_seed(1)
    tokens, k = 7, 2
    x = torch.randn(tokens, layout.hidden)
    idx = torch.stack([torch.randperm(layout.num_experts)[:k] for _ in range(tokens)])
    w = torch.rand(tokens, k)
    want = experts(x, idx, w)
    flat = idx.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=layout.num_experts).tolist()
    y = expert_forward(x[order // k], counts, experts.gate_up_proj, experts.down_proj, experts.act_fn)
    got = torch.zeros_like(x).index_add(0, order // k, y * w.reshape(-1)[order, None])
    assert torch.allclose(got, want, atol=1e-6)


def test_embedding_and_head_find_tied_and_untied_heads():
    tied = _nd_model("qwen2")
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    assert tfa.embedding_and_head(tied) == ("model.embed_tokens", "lm_head", True)
    assert tfa.embedding_and_head(_nd_model("llama3.1")) == ("model.embed_tokens", "lm_head", False)


# ---------------------------------------------------------------------------------------------- sliding windows
def _family_model(family: str, **overrides):
    tok = build_char_tokenizer()
    return build_tiny_model(tok, size="nano", family=family, initializer_range=0.2, **overrides).eval()


def _windowed_causal(length: int, window: int | None) -> torch.Tensor:
    q = torch.arange(length)[:, None]
    k = torch.arange(length)[None, :]
    ok = (k <= q) & ((q - k < window) if window is not None else True)
    return torch.zeros(length, length).masked_fill(~ok, float("-inf"))[None, None]


def test_attention_mask_layout_of_the_families():
    mistral = tfa.attention_mask_layout(_family_model("mistral").config)
    assert mistral.windows == {"all_layers": 8} and not mistral.keyed and mistral.has_windows
    gemma = tfa.attention_mask_layout(_family_model("gemma2").config)
    assert gemma.keyed and gemma.windows == {"sliding_attention": 8, "full_attention": None}
    assert gemma.layer_keys == ("sliding_attention", "full_attention")
    # Qwen2.5's config.json declares sliding_window with use_sliding_window=false: transformers drops the window
    qwen25 = tfa.attention_mask_layout(_family_model("qwen2.5").config)
    assert not qwen25.has_windows and qwen25.unsupported is None
    assert not tfa.attention_mask_layout(_family_model("llama3.1").config).has_windows
    from types import SimpleNamespace

    odd = tfa.attention_mask_layout(SimpleNamespace(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"]))
    assert "linear_attention" in odd.unsupported


@pytest.mark.parametrize("family,overrides", [("gemma2", {}), ("qwen2", {"use_sliding_window": True,
                                                                          "sliding_window": 8, "max_window_layers": 1})])
def test_a_keyed_mask_dict_reaches_each_layer_type(family, overrides):
    """Models with ``layer_types`` take ``{layer type: 4-D mask}``: windowed sliding masks reproduce transformers'
    own masking (2-D mask in), and handing every layer the full causal mask does not."""
    model = _family_model(family, **overrides)
    layout = tfa.attention_mask_layout(model.config)
    length = 20  # > the window of 8
    ids = torch.randint(4, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(length)[None]
    keyed = {name: _windowed_causal(length, w) for name, w in layout.windows.items()}
    unwindowed = {name: _windowed_causal(length, None) for name in layout.windows}
    with torch.no_grad():
        own = model(ids, attention_mask=torch.ones_like(ids), position_ids=pos).logits
        ours = model(ids, attention_mask=keyed, position_ids=pos).logits
        wrong = model(ids, attention_mask=unwindowed, position_ids=pos).logits
    torch.testing.assert_close(ours, own, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(wrong[:, 8:], own[:, 8:], atol=1e-4), "the windows made no difference: a weak test"


def test_one_windowed_mask_serves_a_model_without_layer_types():
    """Mistral applies ``config.sliding_window`` to every layer through its one mask: a 4-D mask must carry it."""
    model = _family_model("mistral")
    length = 20
    ids = torch.randint(4, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(length)[None]
    with torch.no_grad():
        own = model(ids, attention_mask=torch.ones_like(ids), position_ids=pos).logits
        ours = model(ids, attention_mask=_windowed_causal(length, 8), position_ids=pos).logits
        full = model(ids, attention_mask=_windowed_causal(length, None), position_ids=pos).logits
    torch.testing.assert_close(ours, own, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(full[:, 8:], own[:, 8:], atol=1e-4), "a 4-D mask was not used as given"


def test_loadable_attention_demotes_sdpa_only_for_classes_without_it():
    from transformers import AutoModelForCausalLM

    gemma, qwen = _family_model("gemma2").config, _family_model("qwen2").config
    assert tfa.loadable_attention(AutoModelForCausalLM, gemma, "sdpa") == "eager"
    assert tfa.loadable_attention(AutoModelForCausalLM, qwen, "sdpa") == "sdpa"
    assert tfa.loadable_attention(AutoModelForCausalLM, gemma, "flash_attention_2") == "flash_attention_2"


# ---------------------------------------------------------------------------------------------- MoE routers
@pytest.mark.parametrize("family,moe_layers", [("qwen3-moe", 2), ("deepseek-v3", 1)])
def test_router_modules_return_logits_weights_and_expert_ids(family, moe_layers):
    model = _family_model(family)
    routers = tfa.router_modules(model)
    assert len(routers) == moe_layers
    seen = []
    handles = [r.register_forward_hook(lambda m, a, out: seen.append(out)) for r in routers]
    ids = torch.randint(4, model.config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            model(ids)
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == moe_layers
    k, experts = model.config.num_experts_per_tok, 4
    for logits, weights, chosen in seen:
        assert logits.shape == (21, experts) and logits.is_floating_point(), "router_logits: (batch x tokens, E)"
        assert weights.shape == chosen.shape == (21, k) and not chosen.is_floating_point()
        assert int(chosen.min()) >= 0 and int(chosen.max()) < experts
        if family == "qwen3-moe":  # softmax top-k: the ids are the k largest logits
            assert torch.equal(chosen.sort(-1).values, logits.topk(k, -1).indices.sort(-1).values)
    assert tfa.router_modules(_family_model("qwen2")) == []


def test_generation_forwards_skip_the_router_loss_of_a_moe_config_that_asks_for_it():
    """``output_router_logits=true`` (training with the router's auxiliary loss) makes transformers compute that
    loss from ``attention_mask``, which cannot read the engine's 4-D masks: forward_with_cache turns it off."""
    on = _family_model("qwen3-moe", output_router_logits=True)
    off = _family_model("qwen3-moe")
    ids, positions, mask = _inputs(on, batch=2, length=5)
    with torch.no_grad():
        with pytest.raises(RuntimeError):  # what transformers does with the flag on and a 4-D mask
            on(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, past_key_values=None)
        got = tfa.forward_with_cache(on, RecordingCache(), input_ids=ids, attention_mask=mask, position_ids=positions,
                                     use_cache=True).logits
        want = tfa.forward_with_cache(off, RecordingCache(), input_ids=ids, attention_mask=mask,
                                      position_ids=positions, use_cache=True).logits
    torch.testing.assert_close(got, want)
