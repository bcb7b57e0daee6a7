"""The checkpoint engine: bucketed broadcast of full weights from one sender to many receivers.

Members run as threads of this process (gloo works the same between threads and between processes), so
every variant -- per tensor, small buckets, one bucket, overlapped -- is checked bit for bit in a second.
"""

from __future__ import annotations

import threading

import pytest
import torch

from hybridflow.rollout.weights.checkpoint_engine import (
    BroadcastCheckpointEngine,
    WeightSyncSpec,
    free_port,
    full_tensors,
    resolve_backend,
)


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [
        ("w", torch.randn(10, 7, generator=g)),
        ("half", torch.randn(3, generator=g).bfloat16()),
        ("ids", torch.arange(5)),
        ("big", torch.randn(1000, generator=g)),
        ("scalar", torch.tensor(3.5)),
        ("mask", torch.tensor([[True, False], [False, True]])),
    ]


def _sync(spec: WeightSyncSpec, tensors, receivers: int = 2, rounds: int = 1):
    """Send ``tensors`` ``rounds`` times; returns (what each receiver got per round, buckets per round)."""
    got: dict[int, list] = {r: [] for r in range(1, receivers + 1)}
    errors: list[BaseException] = []

    def receive(rank: int) -> None:
        try:
            engine = BroadcastCheckpointEngine(spec, rank).connect()
            for _ in range(rounds):
                received, buckets = {}, 0
                for bucket in engine.receive_buckets():
                    buckets += 1
                    received.update({name: t.clone() for name, t in bucket})  # copy before the next bucket
                got[rank].append((received, buckets))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=receive, args=(r,)) for r in got]
    for t in threads:
        t.start()
    sender = BroadcastCheckpointEngine(spec, 0).connect()
    stats = [sender.send_weights(iter(tensors)) for _ in range(rounds)]
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return got, stats


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("bucket_bytes", [0, 200, 1 << 20])
def test_every_receiver_gets_every_tensor_bit_for_bit(bucket_bytes, overlap):
    tensors = _tensors()
    spec = WeightSyncSpec("gloo", "127.0.0.1", free_port(), 3, bucket_bytes, overlap, timeout_s=60)
    got, stats = _sync(spec, tensors, receivers=2, rounds=2)  # the group is reused by the second sync
    expected_buckets = {0: len(tensors), 1 << 20: 1}.get(bucket_bytes)
    for rank, rounds in got.items():
        for received, buckets in rounds:
            assert list(received) == [name for name, _ in tensors]
            for name, tensor in tensors:
                assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), (rank, name)
            assert buckets == stats[0].buckets
    assert stats[0].tensors == len(tensors)
    assert stats[0].bytes == sum(t.numel() * t.element_size() for _, t in tensors)
    if expected_buckets is not None:
        assert stats[0].buckets == expected_buckets
    else:  # small buckets: several tensors share one, the 4000-byte tensor gets its own
        assert 1 < stats[0].buckets < len(tensors)


def test_a_received_bucket_loads_into_an_hf_rollout_engine(nano_model_dir):
    """Weights broadcast into a rollout engine make it generate exactly what the sender's model generates."""
    from hybridflow.engine.model_loader import load_causal_lm
    from hybridflow.rollout import SamplingParams, create_rollout_engine

    source = load_causal_lm(nano_model_dir)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.05 * torch.randn_like(p))
    target = load_causal_lm(nano_model_dir)
    engine = create_rollout_engine("hf", model=target, max_num_seqs=4)
    spec = WeightSyncSpec("gloo", "127.0.0.1", free_port(), 2, 4096, False, timeout_s=60)

    def receive():
        receiver = BroadcastCheckpointEngine(spec, 1).connect()
        for bucket in receiver.receive_buckets():
            engine.update_weights(bucket)

    thread = threading.Thread(target=receive)
    thread.start()
    BroadcastCheckpointEngine(spec, 0).connect().send_weights(full_tensors(source))
    thread.join(timeout=60)
    for name, p in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], p), name
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=True)
    reference = create_rollout_engine("hf", model=source, max_num_seqs=4)
    assert engine.generate_batch([[1, 2, 3]], params)[0].token_ids == reference.generate_batch([[1, 2, 3]], params)[0].token_ids


def test_tied_weights_are_sent_once():
    module = torch.nn.Module()
    module.embed = torch.nn.Embedding(4, 3)
    module.head = torch.nn.Linear(3, 4, bias=False)
    module.head.weight = module.embed.weight
    assert [name for name, _ in full_tensors(module)] == ["embed.weight"]


def test_backend_names():
    assert resolve_backend("naive", "cpu") == "gloo"
    assert resolve_backend("naive", "cuda") == "nccl"
    assert resolve_backend("gloo", "cuda") == "gloo"
    with pytest.raises(ValueError, match="needs CUDA"):
        resolve_backend("nccl", "cpu")
