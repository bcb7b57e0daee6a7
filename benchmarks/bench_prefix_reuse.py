"""Prefix reuse across agent turns in the ``hf`` engine (``rollout.enable_prefix_caching``): work saved, same tokens.

An agent loop sends turn k+1 of a trajectory as ``prompt = turn k's prompt + its response + a tool
observation``.  This runs N trajectories x 3 turns through one engine the way agent loops do (every
trajectory's next turn is submitted as soon as its previous turn returns, while other rows still decode;
``generate`` from asyncio coroutines), once with prefix caching and once without, and reports the prefill
tokens run through the model vs reused from parked rows (``engine.stats()``), the CPU and wall time of each
run, and whether both produced the same tokens (greedy decoding).

    python benchmarks/bench_prefix_reuse.py            # qwen2 "medium" (20M), 16 trajectories, ~1 minute
    python benchmarks/bench_prefix_reuse.py --smoke    # the tiny model, seconds (a test runs it)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.rollout.hf.engine import HFRolloutEngine  # noqa: E402
from hybridflow.utils.tiny_model import build_bpe_tokenizer, build_tiny_model  # noqa: E402


def trajectories(engine, prompts, observations, turns: int, response: int):
    """Every trajectory runs its turns back to back; all trajectories run concurrently."""
    params = SamplingParams(do_sample=False, max_tokens=response, ignore_eos=True)

    async def one(i, prompt):
        history, responses = list(prompt), []
        for turn in range(turns):
            out = await engine.generate(history, params, f"traj{i}-turn{turn}")
            responses.append(out.token_ids)
            history = history + out.token_ids + observations[(i + turn) % len(observations)]
        return responses

    async def run():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 4 trajectories, short turns")
    ap.add_argument("--size", default=None, help="tiny_model size (default medium; smoke: tiny)")
    ap.add_argument("--trajectories", type=int, default=None)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=None, help="first prompt tokens (default 256; smoke 32)")
    ap.add_argument("--response", type=int, default=None, help="tokens per turn (default 48; smoke 8)")
    ap.add_argument("--observation", type=int, default=None, help="tool observation tokens (default 32; smoke 6)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    size = args.size or ("tiny" if args.smoke else "medium")
    n = args.trajectories or (4 if args.smoke else 16)
    prompt_len = args.prompt_len or (32 if args.smoke else 256)
    response = args.response or (8 if args.smoke else 48)
    obs_len = args.observation or (6 if args.smoke else 32)
    tok = build_bpe_tokenizer()
    model = build_tiny_model(tok, size=size).eval()
    gen = torch.Generator().manual_seed(0)
    first = len(tok.all_special_ids)
    prompts = [torch.randint(first, len(tok), (prompt_len,), generator=gen).tolist() for _ in range(n)]
    observations = [torch.randint(first, len(tok), (obs_len,), generator=gen).tolist() for _ in range(4)]
    print(f"model: qwen2 {size}; {n} trajectories x {args.turns} turns; first prompt {prompt_len} tokens, "
          f"{response} tokens per turn, {obs_len}-token observations; {args.threads} thread(s)")
    rows, outputs = [], {}
    for caching in (True, False, True, False):  # alternate, so machine noise hits both alike
        engine = HFRolloutEngine(model, tok, enable_prefix_caching=caching, max_num_seqs=max(8, n))
        start, cpu = time.perf_counter(), time.process_time()
        outputs.setdefault(caching, trajectories(engine, prompts, observations, args.turns, response))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        rows.append((caching, engine.stats(), wall, cpu))
    print("| prefix caching | prompt tokens | prefill tokens computed | reused from parked rows | prefix hits | "
          "CPU s | wall s |")
    print("|---|---|---|---|---|---|---|")
    for caching, s, wall, cpu in rows:
        print(f"| {'on' if caching else 'off'} | {s['prompt_tokens']} | {s['prefill_tokens']} | "
              f"{s['prefix_reused_tokens']} | {s['prefix_hits']} | {cpu:.2f} | {wall:.2f} |")
    on = [r for r in rows if r[0]]
    off = [r for r in rows if not r[0]]
    same = outputs[True] == outputs[False]
    print(f"same_tokens={same}")
    print(f"prefill_saving={1 - on[0][1]['prefill_tokens'] / off[0][1]['prefill_tokens']:.3f}")
    print(f"cpu_ratio_on_off={min(r[3] for r in on) / min(r[3] for r in off):.3f}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
