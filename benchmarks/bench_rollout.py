"""Rollout throughput: hybridflow's ``hf`` engine vs plain ``transformers`` ``model.generate``.

Both sides get the same model (Qwen2 "medium" from ``hybridflow.utils.tiny_model``, fp32, CPU), the same
left-padded prompts (batch 64, 16-32 tokens) and the same number of forced new tokens, sampled at
temperature 1 with no top-k/top-p (``generate``'s default top_k=50 is switched off so both do the same
work).  Runs alternate in one process so machine noise hits both sides alike.  Each run is timed on
two clocks: wall time, and this process's CPU time (``time.process_time``) -- on a shared machine the
wall clock mostly measures the neighbours, while CPU seconds measure the work each side needs (use
``--threads 1`` for that, so idle OpenMP spinning is not counted).  The table reports best and median
of the rounds for both; the last line is ``ratio=<hybridflow tok/s / generate tok/s>`` from the best
wall-clock rounds, preceded by ``cpu_ratio=`` from the best CPU-time rounds.

    python benchmarks/bench_rollout.py            # full: 4 rounds, 64 new tokens
    python benchmarks/bench_rollout.py --quick    # 2 rounds, 32 new tokens
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.rollout.hf_engine import HFRolloutEngine  # noqa: E402
from hybridflow.utils.tiny_model import build_bpe_tokenizer, build_tiny_model  # noqa: E402


def make_prompts(tokenizer, batch: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    """Random prompts over non-special tokens (the model is random; content does not matter)."""
    gen = torch.Generator().manual_seed(seed)
    first = len(tokenizer.all_special_ids)
    lens = torch.randint(min_len, max_len + 1, (batch,), generator=gen).tolist()
    return [torch.randint(first, len(tokenizer), (n,), generator=gen).tolist() for n in lens]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def run_generate(model, ids, mask, new_tokens: int, pad_id: int) -> tuple[float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
        )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] - ids.shape[1] == new_tokens
    return ids.shape[0] * new_tokens / elapsed, ids.shape[0] * new_tokens / cpu


def run_engine(engine, prompts, new_tokens: int) -> tuple[float, float]:
    params = SamplingParams(temperature=1.0, max_tokens=new_tokens, ignore_eos=True)
    start, cpu = time.perf_counter(), time.process_time()
    outs = engine.generate_batch(prompts, params)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(len(o.token_ids) == new_tokens for o in outs)
    return len(prompts) * new_tokens / elapsed, len(prompts) * new_tokens / cpu


def linear_bound_tok_s(model, batch: int, repeats: int = 5) -> float:
    """Decode tok/s if a step cost only its Linear-layer matmuls (same shapes, no model code): the
    ceiling any engine running this model in eager PyTorch can reach on this machine."""
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1]) for w in linears}

    def step():
        for w in linears:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    best = float("inf")
    with torch.inference_mode():
        step()
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(5):
                step()
            best = min(best, (time.perf_counter() - start) / 5)
    return batch / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 32 new tokens (a smoke run)")
    ap.add_argument("--size", default="medium", help="tiny_model size name (default: medium)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=None, help="forced new tokens (default 64, quick 32)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 4, quick 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = ap.parse_args()
    new_tokens = args.new_tokens or (32 if args.quick else 64)
    rounds = args.rounds or (2 if args.quick else 4)
    torch.set_num_threads(args.threads)

    tok = build_bpe_tokenizer()
    model = build_tiny_model(tok, size=args.size).eval()
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    prompts = make_prompts(tok, args.batch, 16, 32, seed=0)
    ids, mask = left_pad(prompts, tok.pad_token_id)
    engine = HFRolloutEngine(model, tok, max_batch_size=args.batch, seed=0)
    print(f"model: qwen2 {args.size} {params_m:.1f}M params, vocab {len(tok)}, fp32, {args.threads} threads; "
          f"batch {args.batch}, prompts 16-32 tokens, {new_tokens} new tokens sampled, {rounds} rounds")

    run_generate(model, ids[:4], mask[:4], 4, tok.pad_token_id)  # warm-up both paths
    run_engine(engine, prompts[:4], 4)
    hf_rates, ours_rates = [], []  # (wall tok/s, cpu tok/s) per round
    for r in range(rounds):
        hf_rates.append(run_generate(model, ids, mask, new_tokens, tok.pad_token_id))
        ours_rates.append(run_engine(engine, prompts, new_tokens))
        print(f"round {r}: generate {hf_rates[-1][0]:8.1f} tok/s ({hf_rates[-1][1]:8.1f} per cpu-s)   "
              f"hybridflow {ours_rates[-1][0]:8.1f} tok/s ({ours_rates[-1][1]:8.1f} per cpu-s)")

    print(f"\n{'engine':<22}{'best tok/s':>12}{'median tok/s':>14}{'best tok/cpu-s':>16}{'median tok/cpu-s':>18}")
    for name, rates in (("transformers.generate", hf_rates), ("hybridflow hf", ours_rates)):
        wall, cpu = [w for w, _ in rates], [c for _, c in rates]
        print(f"{name:<22}{max(wall):>12.1f}{statistics.median(wall):>14.1f}{max(cpu):>16.1f}"
              f"{statistics.median(cpu):>18.1f}")
    print(f"decode-step matmul bound: {linear_bound_tok_s(model, args.batch):.1f} tok/s (Linear layers only, "
          f"prefill excluded)")
    print(f"cpu_ratio={max(c for _, c in ours_rates) / max(c for _, c in hf_rates):.2f}")
    print(f"ratio={max(w for w, _ in ours_rates) / max(w for w, _ in hf_rates):.2f}")

if __name__ == "__main__":
    main()
