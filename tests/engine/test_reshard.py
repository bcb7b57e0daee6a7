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
    metrics = stats.as_metrics()
    assert metrics["update_weights/bytes"] == stats.bytes and "update_weights/seconds" not in metrics
    if reset_peak_rss():
        assert peak_rss_bytes() > 0 and stats.peak_rss_rise_bytes is not None
