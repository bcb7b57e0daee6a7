"""engine/reshard.py in one process: buckets bounded by their size, tied tensors once, every tensor delivered, the
transition's stats (the gathers themselves are exercised on 2 gloo ranks by tests/integration/test_megatron_ray.py
and benchmarks/bench_reshard.py)."""

from __future__ import annotations

import torch

from hybridflow.engine.reshard import gathered_buckets, peak_rss_bytes, reset_peak_rss, reshard_in_buckets


def _model():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg)


def test_buckets_hold_at_most_their_size_and_tied_weights_come_once():
    model = _model()
    limit = 40_000
    buckets = list(gathered_buckets(model, limit))
    names = [n for b in buckets for n, _ in b]
    assert len(names) == len(set(names)) and "lm_head.weight" not in names  # tied to embed_tokens
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes) <= limit or len(bucket) == 1  # a tensor larger than a bucket travels alone
    assert len(buckets) > 1


def test_reshard_fills_another_copy_and_reports_what_moved():
    source, target = _model(), _model()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    own = dict(target.state_dict())

    def load(bucket):
        for name, tensor in bucket:
            own[name].copy_(tensor)

    stats = reshard_in_buckets(source, load, 40_000)
    for name, tensor in source.state_dict().items():
        assert torch.equal(own[name], tensor), name
    assert stats.tensors == len({t.data_ptr() for t in source.state_dict().values()})
    assert stats.bytes == sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in
                                                                      source.state_dict().values()}.values())
    assert stats.buckets > 1 and stats.max_bucket_bytes <= max(40_000, max(t.numel() * 4 for t in own.values()))
    metrics = stats.update_weights_metrics()
    assert metrics["update_weights/bytes"] == stats.bytes and "update_weights/seconds" not in metrics
    if reset_peak_rss():
        assert peak_rss_bytes() > 0 and stats.peak_rss_rise_bytes is not None


def _lora_model():
    from hybridflow.engine.model_loader import apply_lora

    model = apply_lora(_model(), 4, 8.0, "all-linear")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:  # peft starts B at 0 (the adapter would change nothing)
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def test_a_lora_actor_reaches_a_plain_copy_with_its_adapters_merged():
    source, target = _lora_model(), _model()
    own = dict(target.state_dict())

    def load(bucket):
        for name, tensor in bucket:
            own[name].copy_(tensor)

    stats = reshard_in_buckets(source, load, 10_000)
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = source(input_ids=ids).logits, target(input_ids=ids).logits
    assert float((expected - got).abs().max()) < 1e-5
    with torch.no_grad(), source.disable_adapter():  # the adapters matter: without them the logits differ
        assert float((source(input_ids=ids).logits - got).abs().max()) > 1e-2
    assert stats.buckets > 1


def test_lora_on_moe_experts_reaches_a_plain_copy_with_every_wrapper_merged():
    """MoE experts under LoRA (peft wraps each targeted 3-D expert parameter in a ``ParamWrapper``, one inside the
    other): the plain copy gets the experts under their plain names with every wrapper's delta, as peft's own
    merge_and_unload computes it (the sync used to send ``experts.base_layer.gate_up_proj`` unmerged)."""
    import copy
    import tempfile

    from hybridflow.engine.model_loader import apply_lora, load_causal_lm
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    base = load_causal_lm(str(make_tiny_checkpoint(tempfile.mkdtemp(), size="nano", family="qwen3-moe")))
    target = copy.deepcopy(base)
    before = {n: t.clone() for n, t in base.state_dict().items() if ".experts." in n}
    source = apply_lora(base, 4, 8.0, "all-linear")
    assert any(type(m).__name__ == "ParamWrapper" for m in source.modules())  # the experts are wrapped
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in source.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    own = dict(target.state_dict())
    sent = []

    def load(bucket):
        for name, tensor in bucket:
            sent.append(name)
            own[name].copy_(tensor)

    reshard_in_buckets(source, load, 1 << 20)
    assert not [n for n in sent if "base_layer" in n or "lora_" in n], sent
    expected = copy.deepcopy(source).merge_and_unload().state_dict()
    experts = [n for n in expected if ".experts." in n]
    assert experts and all(torch.allclose(own[n], expected[n], atol=1e-6) for n in experts)
    assert all(torch.allclose(own[n], expected[n], atol=1e-6) for n in expected)
    assert all(float((own[n] - before[n]).abs().max()) > 1e-3 for n in before)  # every expert's delta matters


def test_the_adapter_alone_travels_in_one_bucket_under_peft_names():
    source = _lora_model()
    buckets = list(gathered_buckets(source, 1_000, lora="adapter"))
    names = [n for n, _ in buckets[0]]
    assert len(buckets) == 1 and names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert len(names) == sum(1 for n, _ in source.named_parameters() if ".lora_" in n)


def test_a_group_of_tensors_never_straddles_two_buckets():
    from hybridflow.rollout.weights.delta import vllm_load_group

    buckets = list(gathered_buckets(_model(), 10_000, group_of=vllm_load_group))
    where: dict[str, set[int]] = {}
    for i, bucket in enumerate(buckets):
        for name, _ in bucket:
            where.setdefault(vllm_load_group(name), set()).add(i)
    fused = {g: b for g, b in where.items() if g.endswith((".self_attn", ".mlp"))}  # q/k/v+o, gate/up+down
    assert len(buckets) > 2 and fused and all(len(b) == 1 for b in fused.values())
    # without the grouping the same size cuts q/k/v apart
    plain = [{vllm_load_group(n) for n, _ in b} for b in gathered_buckets(_model(), 10_000)]
    assert any(len([b for b in plain if g in b]) > 1 for g in fused)
