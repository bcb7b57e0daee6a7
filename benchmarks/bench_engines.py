"""Rollout engines side by side: hybridflow's ``hf`` engine vs the ``vllm`` engine vs plain ``model.generate``,
then one GRPO step with each engine.  Needs vLLM: run it with ``.venv-vllm/bin/python`` (``make venv-vllm``).

Generation: the same model (Qwen2 "medium" from ``hybridflow.utils.tiny_model``, ~20M parameters, fp32, CPU),
the same prompts (``--batch`` prompts of 16-32 tokens), ``--new`` new tokens per row (``ignore_eos``: a random
model never samples EOS, so every side does the same work), temperature 1, no top-k/top-p, one core each
(``OMP_NUM_THREADS=1``; vLLM in this process, engine core included).  Rounds alternate the three sides so
machine noise hits them alike; the table has best and median tokens/s on the wall clock and on this process's
CPU clock (on a shared machine the CPU clock measures the work, the wall clock also the neighbours).

GRPO step: ``train_ppo`` on the built-in addition task with the same model, ``--steps`` steps per engine
(local backend, one process), reporting the median ``timing_s/gen`` and ``timing_s/step`` after the first step
and the vLLM run's ``training/rollout_probs_diff_mean`` and ``timing_s/update_weights``.

    .venv-vllm/bin/python benchmarks/bench_engines.py           # 3 rounds, batch 64, 64 new tokens, 4 steps
    .venv-vllm/bin/python benchmarks/bench_engines.py --quick   # 2 rounds, 32 new tokens, 3 steps

Each side is also timed with one new token (prefill + the first token); the difference over ``--new - 1`` is its
decode step on the CPU clock, printed beside the step's matmul bound (the Linear layers' matmuls alone, same shapes
and weights, one core). The generation lines print ``ratio_vllm_vs_generate=``, ``ratio_vllm_vs_hf=``,
``ratio_hf_vs_generate=`` (best wall tokens/s), ``hf_decode_vs_bound=`` and ``decode_ratio_hf_vs_vllm=``; then ``grpo_step_ratio_vllm_vs_hf=`` (median step seconds, hf / vllm: above 1 means vLLM is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._common import print_state, print_table  # noqa: E402
from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.rollout.hf.engine import HFRolloutEngine  # noqa: E402


def make_prompts(vocab: int, first: int, batch: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(16, 33, (batch,), generator=gen).tolist()
    return [torch.randint(first, vocab, (n,), generator=gen).tolist() for n in lens]


def timed(fn) -> tuple[float, float, object]:
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


def bench_generation(model_dir: str, rounds: int, batch: int, new: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = make_prompts(len(tok), len(tok.all_special_ids), batch)
    pad = tok.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    # Prefix caching off on both engines: the same prompts run every round, and a cached prefix would skip the
    # prefill that ``generate`` (and a first rollout of new prompts) pays.
    hf = HFRolloutEngine(model, tok, seed=0, enable_prefix_caching=False)
    vllm = VLLMRolloutEngine(model_dir, engine_args={
        "enable_prefix_caching": False,
        "dtype": "float32", "enforce_eager": True, "max_model_len": 32 + new + 8, "max_num_seqs": batch,
        "max_num_batched_tokens": batch * (32 + new + 8), "kv_cache_memory_bytes": 512 << 20,
        "load_format": "auto"}, tokenizer=tok, seed=0)
    print(f"vLLM engine started in {vllm.start_seconds:.1f}s", flush=True)
    useful = batch * new

    def run_generate(n: int):
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, max_new_tokens=n, min_new_tokens=n, pad_token_id=pad)
        assert out.shape[1] - ids.shape[1] == n

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True)

    sides = {"generate": run_generate, "hf engine": lambda n: hf.generate_batch(prompts, params(n)),
             "vllm engine": lambda n: vllm.generate_batch(prompts, params(n))}
    for fn in sides.values():  # warm-up (allocations, first-call paths)
        fn(new)
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
    decode_ms: dict[str, list[float]] = {k: [] for k in sides}
    try:
        for r in range(rounds):
            for name, fn in sides.items():
                wall, cpu, _ = timed(lambda: fn(new))
                _, cpu_first, _ = timed(lambda: fn(1))  # prefill + the first token: the rest is decode steps
                results[name].append((useful / wall, useful / cpu))
                decode_ms[name].append(1e3 * (cpu - cpu_first) / (new - 1))
            print(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1][0]:.0f} tok/s" for k, v in results.items()),
                  flush=True)
    finally:
        vllm.shutdown()
    return results, decode_ms


def decode_bound_ms(model, batch: int, repeats: int = 5) -> float:
    """CPU ms of one decode step's Linear-layer matmuls alone (same shapes and weights, no model code): the
    matmul-bound time of a decode step of ``batch`` rows on one core."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1]) for w in weights}
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.process_time()
            for w in weights:
                torch.nn.functional.linear(inputs[w.shape[1]], w)
            best = min(best, time.process_time() - start)
    return 1e3 * best


def bench_grpo_step(model_dir: str, data_dir: Path, engine: str, steps: int, out_dir: Path) -> dict[str, float]:
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    a = "actor_rollout_ref"
    overrides = [
        "algorithm.adv_estimator=grpo", f"{a}.model.path={model_dir}", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", "data.train_batch_size=16", "data.max_prompt_length=32",
        "data.max_response_length=16", f"{a}.rollout.name={engine}", f"{a}.rollout.n=4",
        f"{a}.actor.ppo_mini_batch_size=8", f"{a}.actor.ppo_micro_batch_size_per_gpu=16",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu=64", f"{a}.actor.optim.lr=1e-4",
        f"{a}.model.enable_gradient_checkpointing=false", f"{a}.rollout.calculate_log_probs=true",
        f"{a}.rollout.tensor_model_parallel_size=1", f"{a}.rollout.dtype=float32", f"{a}.rollout.enforce_eager=true",
        f"{a}.rollout.gpu_memory_utilization=0.05", f"{a}.rollout.max_num_seqs=64", f"{a}.rollout.agent.num_workers=1",
        "trainer.backend=local", "trainer.device=cpu", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=[file]", "trainer.report=false", "trainer.resume_mode=disable",
        f"trainer.default_local_dir={out_dir}/ckpt",
    ]
    metrics = train_ppo(load_config(overrides), logger=Tracking("bench", engine, default_backend=["file"],
                                                                output_dir=out_dir / engine)).metrics
    later = metrics[1:] or metrics
    out = {"step_s": statistics.median(m["timing_s/step"] for m in later),
           "gen_s": statistics.median(m["timing_s/gen"] for m in later)}
    if "training/rollout_probs_diff_mean" in later[-1]:
        out["rollout_probs_diff_mean"] = max(m["training/rollout_probs_diff_mean"] for m in metrics)
        out["rollout_probs_diff_max"] = max(m["training/rollout_probs_diff_max"] for m in metrics)
    if "timing_s/update_weights" in later[-1]:
        out["update_weights_s"] = statistics.median(m["timing_s/update_weights"] for m in later)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--skip-grpo", action="store_true")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 3)
    new = args.new or (32 if args.quick else 64)
    steps = args.steps or (3 if args.quick else 4)

    from hybridflow.data.synthetic import write_synthetic
    from hybridflow.utils.tiny_model import make_tiny_checkpoint

    work = Path(tempfile.mkdtemp(prefix="bench_engines_"))
    model_dir = str(make_tiny_checkpoint(work / "model", size="medium", tokenizer="bpe"))
    print_state(f"bench_engines: generation, batch {args.batch} x {new} new tokens, fp32, one core")
    gen, decode_ms = bench_generation(model_dir, rounds, args.batch, new)
    rows = []
    for name, runs in gen.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        rows.append([name, f"{max(walls):.0f}", f"{statistics.median(walls):.0f}", f"{max(cpus):.0f}",
                     f"{statistics.median(cpus):.0f}"])
    print_table(["side", "best tok/s (wall)", "median (wall)", "best tok/s (CPU)", "median (CPU)"], rows)
    best = {k: max(w for w, _ in v) for k, v in gen.items()}
    best_cpu = {k: max(c for _, c in v) for k, v in gen.items()}
    print(f"ratio_vllm_vs_generate={best['vllm engine'] / best['generate']:.2f}")
    print(f"ratio_vllm_vs_hf={best['vllm engine'] / best['hf engine']:.2f}")
    print(f"ratio_hf_vs_generate={best['hf engine'] / best['generate']:.2f}")
    print(f"cpu_ratio_vllm_vs_hf={best_cpu['vllm engine'] / best_cpu['hf engine']:.2f}")
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    bound = decode_bound_ms(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), args.batch)
    step = {k: statistics.median(v) for k, v in decode_ms.items()}
    print_table(["side", "decode step CPU ms (median)", "vs matmul bound"],
                [[k, f"{v:.1f}", f"{v / bound:.2f}"] for k, v in step.items()])
    print(f"decode_bound_ms={bound:.1f}  (Linear-layer matmuls of one decode step of {args.batch} rows, one core)")
    print(f"hf_decode_vs_bound={step['hf engine'] / bound:.2f}")
    print(f"decode_ratio_hf_vs_vllm={step['hf engine'] / step['vllm engine']:.2f}  (above 1: vLLM's step is faster)")
    if args.skip_grpo:
        return 0
    data = work / "addition"
    write_synthetic("addition", str(data), train_size=512, test_size=16, seed=0)
    print_state(f"bench_engines: GRPO step (16 prompts x 4, 16 new tokens), {steps} steps per engine")
    step = {engine: bench_grpo_step(model_dir, data, engine, steps, work / "runs") for engine in ("hf", "vllm")}
    rows = [[e, f"{v['step_s']:.2f}", f"{v['gen_s']:.2f}", f"{v.get('update_weights_s', float('nan')):.3f}",
             f"{v.get('rollout_probs_diff_mean', float('nan')):.2e}"] for e, v in step.items()]
    print_table(["engine", "step s (median)", "gen s (median)", "update_weights s", "rollout_probs_diff_mean"], rows)
    print(f"grpo_cpu_note=wall-clock step times; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"grpo_step_ratio_vllm_vs_hf={step['hf']['step_s'] / step['vllm']['step_s']:.2f}")
    print(f"grpo_gen_ratio_vllm_vs_hf={step['hf']['gen_s'] / step['vllm']['gen_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
