"""The hf engine on CUDA: bf16 autocast over fp32 weights with a bf16 KV cache, the gpu_memory_utilization
budget on the real device, and the cache's memory returned at sleep.  Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine
from hybridflow.rollout.hf.kv_cache import KVGeometry

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def cuda_model(model_and_tokenizer):
    import copy

    model, tok = model_and_tokenizer
    return copy.deepcopy(model).cuda(), tok


def greedy(m):
    return SamplingParams(do_sample=False, max_tokens=m, ignore_eos=True, logprobs=True)


def test_bf16_rollout_on_cuda(cuda_model, prompt_texts):
    model, tok = cuda_model
    prompts = [tok.encode(t) for t in prompt_texts]
    bf16 = HFRolloutEngine(model, tok, dtype="bfloat16")
    fp32 = HFRolloutEngine(model, tok, dtype="float32")
    assert bf16.compute_dtype == torch.bfloat16 and fp32.compute_dtype == torch.float32
    a, b = bf16.generate_batch(prompts, greedy(12)), fp32.generate_batch(prompts, greedy(12))
    cache = bf16._batcher.cache
    assert cache.keys[0].dtype == torch.bfloat16
    per_token = KVGeometry.from_config(model.config, torch.bfloat16).bytes_per_token
    assert bf16.kv_cache_bytes == cache.max_rows * cache.capacity * per_token == fp32.kv_cache_bytes // 2
    first = torch.tensor([o.log_probs[0] for o in a]) - torch.tensor([o.log_probs[0] for o in b])
    assert bool((first != 0).any()) and first.abs().max() < 0.5


def test_gpu_memory_utilization_bounds_the_cache(cuda_model, prompt_texts):
    model, tok = cuda_model
    prompts = [tok.encode(t) for t in prompt_texts]
    tiny = HFRolloutEngine(model, tok, gpu_memory_utilization=1e-9)
    with pytest.raises(MemoryError, match="gpu_memory_utilization"):
        tiny.generate_batch(prompts[:1], greedy(8))
    engine = HFRolloutEngine(model, tok, gpu_memory_utilization=0.5)
    engine.generate_batch(prompts, greedy(8))
    free, _ = torch.cuda.mem_get_info()
    assert 0 < engine.kv_cache_bytes < 0.5 * (free + engine.kv_cache_bytes)
    before = torch.cuda.memory_allocated()
    engine.sleep()
    assert engine.kv_cache_bytes == 0 and torch.cuda.memory_allocated() < before
