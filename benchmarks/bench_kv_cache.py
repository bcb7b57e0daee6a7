"""KV-cache bytes of the ``hf`` rollout engine for a Qwen2.5-0.5B-shaped model: before / after sizing by demand.

The model is built from a ``Qwen2Config`` with Qwen2.5-0.5B's shape (24 layers, 14 heads, 2 KV heads, head_dim
64, hidden 896; random init, nothing downloaded).  The workload is one rollout batch: 64 requests, a 24-token
prompt and a 1000-token response budget each (1024 columns).

* **before** -- what the engine allocated until this change, from its sizing rule: ``max_num_seqs`` rows
  (verl's default 1024, which the worker passes) x the batch's columns rounded up to 64, in the master-weight
  dtype (fp32), kept until ``sleep()``.  Computed, not allocated: it does not fit in this machine's memory.
* **after** -- allocated for real by the engine here: the 64 requests are admitted (one shared prefill,
  one decode step), the cache size is read, then ``abort_all()`` ends them.  Measured twice: computing in
  fp32 (CPU, and GPU with ``rollout.dtype=float32``) and under bf16 autocast (GPU's default
  ``rollout.dtype=bfloat16``; run here through the same code path on CPU).

    python benchmarks/bench_kv_cache.py            # ~1 minute, ~4 GB of RAM
    python benchmarks/bench_kv_cache.py --smoke    # the tiny model, seconds (a test runs it)
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.rollout.hf.batcher import BatcherLimits, ContinuousBatcher, GenerationRequest  # noqa: E402
from hybridflow.rollout.hf.kv_cache import KVGeometry  # noqa: E402

OLD_COLUMN_QUANTUM = 64


def qwen25_05b_shaped(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).eval()


def measure(model, dtype, rows: int, prompt_len: int, response: int, max_num_seqs: int) -> dict:
    batcher = ContinuousBatcher(model, 0, torch.Generator().manual_seed(0), BatcherLimits(max_num_seqs=max_num_seqs),
                                compute_dtype=dtype)
    prompt = list(range(10, 10 + prompt_len))
    outs = []
    for i in range(rows):  # rollout.n-style copies of one prompt: one shared prefill forward
        batcher.submit(GenerationRequest(f"r{i}", prompt, SamplingParams(temperature=1.0, max_tokens=response,
                                                                          ignore_eos=True), outs.append, None))
    start = time.perf_counter()
    batcher.step()  # admit all (prefill) + the first decode step
    seconds = time.perf_counter() - start
    stats = batcher.stats()
    with batcher.lock:
        aborted = batcher.abort_all()
    assert aborted == rows and all(o.finish_reason == "abort" for o in outs)
    batcher.release_cache()
    return {**stats, "seconds": seconds, "kv_dtype": str(dtype).replace("torch.", "")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="the tiny test model, 8 rows x 64 tokens")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--response", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=1024, help="verl's rollout.max_num_seqs default")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    if args.smoke:
        from hybridflow.utils.tiny_model import build_char_tokenizer, build_tiny_model

        model = build_tiny_model(build_char_tokenizer(), size="nano").eval()
        name = "nano"
    else:
        model = qwen25_05b_shaped(vocab=151936)
        name = "Qwen2.5-0.5B-shaped"
    rows = args.rows or (8 if args.smoke else 64)
    response = args.response or (40 if args.smoke else 1000)
    cols = args.prompt_len + response
    fp32 = KVGeometry.from_config(model.config, torch.float32)
    before = args.max_num_seqs * (-(-cols // OLD_COLUMN_QUANTUM) * OLD_COLUMN_QUANTUM) * fp32.bytes_per_token
    print(f"model: {name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, "
          f"{fp32.layers} layers x {fp32.kv_heads} kv heads x head_dim {fp32.head_dim}); workload: {rows} requests "
          f"x ({args.prompt_len} prompt + {response} response) tokens; max_num_seqs={args.max_num_seqs}")
    print("| sizing | KV dtype | rows | columns | KV bytes | GiB |")
    print("|---|---|---|---|---|---|")
    print(f"| before (max_num_seqs rows, computed) | float32 | {args.max_num_seqs} | "
          f"{-(-cols // OLD_COLUMN_QUANTUM) * OLD_COLUMN_QUANTUM} | {before} | {before / 2**30:.2f} |")
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        r = measure(model, dtype, rows, args.prompt_len, response, args.max_num_seqs)
        results.append(r)
        print(f"| after (by demand, allocated) | {r['kv_dtype']} | {r['kv_cache_rows']} | {r['kv_cache_columns']} | "
              f"{r['kv_cache_bytes']} | {r['kv_cache_bytes'] / 2**30:.2f} |")
    for r in results:
        print(f"kv_bytes_ratio_{r['kv_dtype']}={r['kv_cache_bytes'] / before:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
