"""``actor.use_torch_compile``: the log-prob (+ entropy) kernel compiled vs eager, over vocabulary sizes.

For each vocabulary size V: (rows, V) fp32 logits, log π(label) forward + backward (and the entropy forward),
eager and ``torch.compile(dynamic=True)`` alternating; prints the per-call medians, their ratio and the first
(compiling) call.  This is what ``engine/compiled_kernels.COMPILE_MIN_VOCAB`` is set from.

    .venv/bin/python benchmarks/bench_compile.py [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import machine_state  # noqa: E402
from hybridflow.engine.compiled_kernels import _entropy, _logprob, compiled_entropy, compiled_logprob  # noqa: E402


def _time(fn, reps: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="two small vocabularies, 2 repetitions")
    args = ap.parse_args()
    torch.set_num_threads(1)
    vocabs, rows, reps = ((100, 2048), 64, 2) if args.smoke else ((100, 2048, 8192, 32000), 512, 5)
    print(f"# {machine_state()}")
    print("| V | kernel | eager ms | compiled ms | compiled / eager | first compiled call s |")
    print("|---|---|---|---|---|---|")
    ratios = {}
    for v in vocabs:
        x = torch.randn(rows, v, requires_grad=True)
        y = torch.randint(0, v, (rows,))

        def lp_step(f):
            x.grad = None
            f(x, y).sum().backward()

        for name, eager, compiled in (("log-prob fwd+bwd", lambda: lp_step(_logprob), lambda: lp_step(compiled_logprob)),
                                      ("entropy fwd", lambda: _entropy(x.detach()),
                                       lambda: compiled_entropy(x.detach()))):
            start = time.perf_counter()
            compiled()
            first = time.perf_counter() - start
            e, c = _time(eager, reps), _time(compiled, reps)
            ratios[(v, name)] = c / e
            print(f"| {v} | {name} | {1e3 * e:.2f} | {1e3 * c:.2f} | {c / e:.2f} | {first:.1f} |", flush=True)
    big = max(vocabs)
    print(f"compile_ratio_v{big}={ratios[(big, 'log-prob fwd+bwd')]:.2f}")


if __name__ == "__main__":
    main()
