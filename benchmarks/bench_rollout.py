"""Rollout throughput: hybridflow's ``hf`` engine vs plain ``transformers`` ``model.generate``.

Both sides get the same model (Qwen2 "medium" from ``hybridflow.utils.tiny_model``, fp32, CPU), the same
left-padded prompts (batch 64, 16-32 tokens) and sample at temperature 1 with no top-k/top-p
(``generate``'s default top_k=50 is switched off so both do the same work).  Two workloads:

* ``distinct`` -- 64 different prompts, every response forced to the same length: exactly the same
  arithmetic on both sides, so the ratio measures engine overhead only.
* ``grpo`` -- what an RL rollout looks like: 16 prompts x ``rollout.n`` = 4 samples, and responses that
  end at different lengths (drawn uniformly in [new/4, new], standing in for EOS, which a random model
  never samples).  ``generate`` cannot retire a row early, so it decodes all 64 rows until the longest
  is done, and prefills every copy of a prompt; hybridflow prefills each distinct prompt once (shared
  prefill) and drops finished rows from the decode batch (continuous batching).  Both sides are credited
  with the same useful tokens: the sum of the per-row lengths.

Runs alternate in one process so machine noise hits both sides alike.  Each run is timed on two clocks:
wall time, and this process's CPU time (``time.process_time``) -- on a shared machine the wall clock
mostly measures the neighbours, while CPU seconds measure the work (use ``--threads 1`` so idle OpenMP
spinning is not counted).  The table reports best and median of the rounds; the last lines are
``cpu_ratio=`` and ``ratio=<hybridflow tok/s / generate tok/s>`` of the ``grpo`` workload (best rounds),
after the same two numbers for ``distinct``.

    python benchmarks/bench_rollout.py            # full: 4 rounds, 64 new tokens
    python benchmarks/bench_rollout.py --quick    # 2 rounds, 32 new tokens
    python benchmarks/bench_rollout.py --smoke    # seconds: the tiny model, batch 8 (a test runs it)
    python benchmarks/bench_rollout.py --quick --threads 1 --baseline-root /path/to/other/checkout

``--baseline-root DIR`` adds a third engine to the alternation: the ``hf`` engine of another checkout
(e.g. ``git worktree add /tmp/base main``), imported into this process under the package name
``baseline_rollout`` (its ``hybridflow/rollout`` modules, their imports of each other redirected; everything
else shared), so a change to the engine is measured before/after in one run on the same model and
prompts.  It prints ``cpu_ratio_vs_baseline=`` / ``cpu_ratio_vs_baseline_distinct=`` (this engine's
tok/cpu-s over the baseline's, median rounds).
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import os
import re
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.rollout.hf.engine import HFRolloutEngine  # noqa: E402
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


def run_generate(model, ids, mask, new_tokens: int, pad_id: int, useful: int) -> tuple[float, float]:
    """``generate`` decodes every row for ``new_tokens`` steps; it is credited with ``useful`` tokens."""
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
        )
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] - ids.shape[1] == new_tokens
    return useful / elapsed, useful / cpu


class _BaselineFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``baseline_rollout.<name>`` from ``<root>/hybridflow/rollout/<name>.py``, with that package's
    ``hybridflow.rollout.<name>`` imports pointed at ``baseline_rollout.<name>``."""

    PACKAGE = "baseline_rollout"

    def __init__(self, root: Path):
        self.dir = root / "hybridflow" / "rollout"
        names = sorted(p.stem for p in self.dir.glob("*.py") if p.stem != "__init__")
        self.pattern = re.compile(r"\bhybridflow\.rollout\.(" + "|".join(map(re.escape, names)) + r")\b")

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.PACKAGE:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        if fullname.startswith(self.PACKAGE + ".") and (self.dir / f"{fullname.split('.', 1)[1]}.py").exists():
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        if module.__name__ == self.PACKAGE:
            module.__path__ = []
            return
        path = self.dir / f"{module.__name__.split('.', 1)[1]}.py"
        module.__file__, source = str(path), path.read_text()
        exec(compile(self.pattern.sub(self.PACKAGE + r".\1", source), str(path), "exec"), module.__dict__)


def load_baseline(root: Path):
    """``(HFRolloutEngine, SamplingParams)`` of the checkout at ``root``, importable next to this one's."""
    sys.meta_path.insert(0, _BaselineFinder(root.resolve()))
    engine_mod = importlib.import_module(f"{_BaselineFinder.PACKAGE}.hf_engine")
    params_mod = importlib.import_module(f"{_BaselineFinder.PACKAGE}.sampling_params")
    return engine_mod.HFRolloutEngine, params_mod.SamplingParams


def build_engine(cls, model, tok, batch: int):
    # Prefix caching off: every round runs the same prompts, and a parked prefix would skip the prefill that
    # ``generate`` pays (checkouts before prefix caching lack the argument).
    for kwargs in ({"max_num_seqs": batch, "enable_prefix_caching": False}, {"max_num_seqs": batch}):
        try:
            return cls(model, tok, seed=0, **kwargs)
        except TypeError:
            continue
    return cls(model, tok, max_batch_size=batch, seed=0)  # checkouts before the engine took verl's key names


def run_engine(engine, prompts, lengths: list[int], params_cls=SamplingParams) -> tuple[float, float]:
    """Row i stops after ``lengths[i]`` tokens (its stand-in for EOS)."""
    params = [params_cls(temperature=1.0, max_tokens=n, ignore_eos=True) for n in lengths]
    start, cpu = time.perf_counter(), time.process_time()
    outs = engine.generate_batch(prompts, params)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert [len(o.token_ids) for o in outs] == lengths
    return sum(lengths) / elapsed, sum(lengths) / cpu


def make_workload(tok, name: str, batch: int, new_tokens: int, group: int = 4):
    """(prompts, per-row response lengths) of workload ``name`` (see the module docstring)."""
    if name == "distinct":
        return make_prompts(tok, batch, 16, 32, seed=0), [new_tokens] * batch
    if batch % group:
        raise SystemExit(f"--batch {batch} must be a multiple of the group size {group} for the grpo workload")
    distinct = make_prompts(tok, batch // group, 16, 32, seed=0)
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(max(1, new_tokens // 4), new_tokens + 1, (batch,), generator=gen).tolist()
    lengths[0] = new_tokens  # the longest row decides how long generate() runs
    return [p for p in distinct for _ in range(group)], lengths


def measure(model, tok, engine, name: str, batch: int, new_tokens: int, rounds: int, baseline=None):
    prompts, lengths = make_workload(tok, name, batch, new_tokens)
    ids, mask = left_pad(prompts, tok.pad_token_id)
    hf_rates, ours_rates, base_rates = [], [], []  # (wall tok/s, cpu tok/s) per round
    for r in range(rounds):
        hf_rates.append(run_generate(model, ids, mask, new_tokens, tok.pad_token_id, sum(lengths)))
        if baseline is not None and r % 2:  # the two engines take turns going first
            base_rates.append(run_engine(baseline[0], prompts, lengths, baseline[1]))
        ours_rates.append(run_engine(engine, prompts, lengths))
        if baseline is not None and not r % 2:
            base_rates.append(run_engine(baseline[0], prompts, lengths, baseline[1]))
        line = (f"[{name}] round {r}: generate {hf_rates[-1][0]:8.1f} tok/s ({hf_rates[-1][1]:8.1f} per cpu-s)   "
                f"hybridflow {ours_rates[-1][0]:8.1f} tok/s ({ours_rates[-1][1]:8.1f} per cpu-s)")
        if baseline is not None:
            line += f"   baseline {base_rates[-1][0]:8.1f} tok/s ({base_rates[-1][1]:8.1f} per cpu-s)"
        print(line)
    return hf_rates, ours_rates, base_rates


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 32 new tokens")
    ap.add_argument("--smoke", action="store_true", help="1 round, tiny model, batch 8, 8 new tokens")
    ap.add_argument("--size", default=None, help="tiny_model size name (default: medium; smoke: tiny)")
    ap.add_argument("--batch", type=int, default=None, help="decode batch (default 64; smoke 8)")
    ap.add_argument("--new-tokens", type=int, default=None, help="longest response (default 64, quick 32)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 4, quick 2)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default 2; smoke: unchanged)")
    ap.add_argument("--baseline-root", type=Path, default=None,
                    help="another checkout whose hf engine runs in the same rounds (before/after in one run)")
    args = ap.parse_args(argv)
    size = args.size or ("tiny" if args.smoke else "medium")
    batch = args.batch or (8 if args.smoke else 64)
    new_tokens = args.new_tokens or (8 if args.smoke else 32 if args.quick else 64)
    rounds = args.rounds or (1 if args.smoke else 2 if args.quick else 4)
    threads = args.threads or (torch.get_num_threads() if args.smoke else 2)
    torch.set_num_threads(threads)

    tok = build_bpe_tokenizer()
    model = build_tiny_model(tok, size=size).eval()
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    engine = build_engine(HFRolloutEngine, model, tok, batch)
    baseline = None
    if args.baseline_root is not None:
        base_cls, base_params = load_baseline(args.baseline_root)
        baseline = (build_engine(base_cls, model, tok, batch), base_params)
    load = os.getloadavg()
    print(f"[{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}] "
          f"model: qwen2 {size} {params_m:.1f}M params, vocab {len(tok)}, fp32, {threads} threads; "
          f"batch {batch}, prompts 16-32 tokens, up to {new_tokens} new tokens sampled, {rounds} rounds")
    warm = make_prompts(tok, 4, 16, 32, seed=9)
    run_generate(model, *left_pad(warm, tok.pad_token_id), 4, tok.pad_token_id, 16)  # warm-up both paths
    run_engine(engine, warm, [4] * 4)
    if baseline is not None:
        run_engine(baseline[0], warm, [4] * 4, baseline[1])

    results = {name: measure(model, tok, engine, name, batch, new_tokens, rounds, baseline)
               for name in ("distinct", "grpo")}
    print("\n| workload | engine | best tok/s | median tok/s | best tok/cpu-s | median tok/cpu-s |")
    print("|---|---|---|---|---|---|")
    for name, (hf_rates, ours_rates, base_rates) in results.items():
        rows = (("transformers.generate", hf_rates), ("hybridflow hf", ours_rates), ("baseline hf", base_rates))
        for engine_name, rates in rows:
            if not rates:
                continue
            wall, cpu = [w for w, _ in rates], [c for _, c in rates]
            print(f"| {name} | {engine_name} | {max(wall):.1f} | {statistics.median(wall):.1f} | {max(cpu):.1f} "
                  f"| {statistics.median(cpu):.1f} |")
    print(f"decode-step matmul bound: {linear_bound_tok_s(model, batch):.1f} tok/s (Linear layers only, "
          f"prefill excluded)")
    for name in ("distinct", "grpo"):
        hf_rates, ours_rates, base_rates = results[name]
        suffix = "" if name == "grpo" else f"_{name}"
        if base_rates:
            ratio = statistics.median(c for _, c in ours_rates) / statistics.median(c for _, c in base_rates)
            print(f"cpu_ratio_vs_baseline{suffix}={ratio:.3f}")
        print(f"cpu_ratio{suffix}={max(c for _, c in ours_rates) / max(c for _, c in hf_rates):.2f}")
        print(f"ratio{suffix}={max(w for w, _ in ours_rates) / max(w for w, _ in hf_rates):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
