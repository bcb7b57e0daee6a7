"""Why every worker process gets its own torch thread count: 2 data-parallel ranks on this machine's
cores, with and without the per-worker setting (spec S15, issue 6 item 6).

Each rank is a separate process (as a Ray worker is) running the actor's training pattern on the
``small``/``medium`` tiny model: forward, backward, gradient all-reduce over gloo, optimizer step.
``per-worker`` gives each rank ``cores // ranks`` intra-op threads, which is what
``RayWorkerGroup`` does through ``OMP_NUM_THREADS`` and ``Worker.__init__``; ``torch default`` leaves
torch's default (one thread per core in every process), so the ranks oversubscribe the cores and
OpenMP barriers spin against each other.  Variants alternate; the median step time of each is printed
and, last, ``oversubscription_slowdown=<default / per-worker>``.

    python benchmarks/bench_threads.py [--size medium] [--steps 6] [--rounds 2] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def _rank_main(rank: int, world: int, port: int, threads: int, size: str, steps: int, rows: int,
               seq: int, out) -> None:
    if threads > 0:
        torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from hybridflow.utils.tiny_model import build_bpe_tokenizer, build_tiny_model

    torch.manual_seed(0)
    model = build_tiny_model(build_bpe_tokenizer(), size=size)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(10, 500, (rows, seq), generator=torch.Generator().manual_seed(rank))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        out.put((torch.get_num_threads(), statistics.median(times[1:])))
    dist.destroy_process_group()


def run(threads: int, args) -> tuple[int, float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + (os.getpid() + threads * 7 + int(time.time())) % 2000
    procs = [ctx.Process(target=_rank_main, args=(r, args.ranks, port, threads, args.size, args.steps, args.rows,
                                                   args.seq, queue)) for r in range(args.ranks)]
    env_threads = os.environ.pop("OMP_NUM_THREADS", None)  # torch default = one thread per core
    try:
        for p in procs:
            p.start()
    finally:
        if env_threads is not None:
            os.environ["OMP_NUM_THREADS"] = env_threads
    result = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank exited with code {p.exitcode}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="medium")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--smoke", action="store_true", help="nano model, 2 steps, 1 round")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size, args.steps, args.rounds, args.rows, args.seq = "nano", 2, 1, 2, 16
    cores = os.cpu_count() or 1
    per_worker = max(1, cores // args.ranks)
    C.print_state(f"bench_threads: {args.ranks} gloo ranks, {args.size}, {args.rows}x{args.seq} tokens, {cores} cores")
    results: dict[str, list[float]] = {"per-worker": [], "torch default": []}
    used: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, threads in (("per-worker", per_worker), ("torch default", 0)):
            used[name], step_s = run(threads, args)
            results[name].append(step_s)
    rows = [(name, used[name], args.ranks * used[name], f"{statistics.median(v):.3f}") for name, v in results.items()]
    C.print_table(["threads", "per rank", "total on the cores", "median step s"], rows)
    slowdown = statistics.median(results["torch default"]) / statistics.median(results["per-worker"])
    print(f"oversubscription_slowdown={slowdown:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
