"""GPU check: GRPO with the vLLM rollout on a Qwen2.5-0.5B-architecture model (random init, bf16), one GPU.

NOT RUN YET: written without a GPU (no GPU was lent to the session that wrote it).  Run it on a GPU machine with
vLLM installed (``pip install -c <(echo torch==YOUR_TORCH) -e ".[vllm,test]"``) and put the printed table, dated,
in benchmarks/RESULTS.md (section "GPU checks").

The model is built from Qwen2.5-0.5B's configuration (24 layers, hidden 896, 14 heads / 2 KV heads, vocab
151936, tied embeddings) with random weights, so nothing is downloaded; the tokenizer is hybridflow's small BPE
(its ids are a subset of the model's vocabulary).  Prompts come from the built-in addition task (or GSM8K with
``--gsm8k DIR``); rewards are meaningless on a random model -- this measures the machinery, not learning.

Reported per run (medians over steps after the first): ``perf/throughput`` (tokens/s/GPU, verl's definition:
prompt+response tokens / step time / GPUs; verl's logs show ~1.6k for PPO at this size on one GPU), step and
generation seconds, ``timing_s/update_weights`` (the actor -> vLLM weight sync, in buckets of
``update_weights_bucket_megabytes``), peak GPU memory, and ``training/rollout_probs_diff_{mean,max}`` (bf16 on
both sides, so expect ~1e-3, not the 1e-9 of fp32 on CPU).

    python benchmarks/gpu/bench_grpo_vllm.py                   # 8 steps, 64 prompts x 5, 512 new tokens
    python benchmarks/gpu/bench_grpo_vllm.py --quick           # 4 steps, 32 x 4, 256 tokens
    python benchmarks/gpu/bench_grpo_vllm.py --standalone      # rollout in a vLLM server process instead
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu")


def build_model(folder: Path) -> str:
    """Qwen2.5-0.5B architecture, random init, bf16, with hybridflow's BPE tokenizer; no download."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridflow.utils.tiny_model import build_bpe_tokenizer

    tok = build_bpe_tokenizer()
    cfg = AutoConfig.for_model("qwen2", **QWEN25_05B, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                               bos_token_id=None)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen2.5-0.5B architecture, {n / 1e6:.0f}M parameters, bf16, random init -> {folder}")
    return str(folder)


def overrides(model_dir: str, data_dir: Path, out_dir: Path, args) -> list[str]:
    a = "actor_rollout_ref"
    return [
        "algorithm.adv_estimator=grpo", f"{a}.model.path={model_dir}", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", f"data.train_batch_size={args.batch}",
        "data.max_prompt_length=256", f"data.max_response_length={args.response}", "data.filter_overlong_prompts=true",
        f"{a}.model.use_remove_padding=true", f"{a}.model.enable_gradient_checkpointing=true",
        f"{a}.actor.optim.lr=1e-6", f"{a}.actor.ppo_mini_batch_size={args.batch // 2}",
        f"{a}.actor.use_dynamic_bsz=true", f"{a}.actor.ppo_max_token_len_per_gpu=16384",
        f"{a}.actor.use_kl_loss=true", f"{a}.actor.kl_loss_coef=0.001", f"{a}.actor.kl_loss_type=low_var_kl",
        f"{a}.actor.fsdp_config.model_dtype=bf16", f"{a}.ref.fsdp_config.model_dtype=bf16",
        f"{a}.rollout.name=vllm", f"{a}.rollout.n={args.n}", f"{a}.rollout.tensor_model_parallel_size=1",
        f"{a}.rollout.gpu_memory_utilization={args.gpu_memory_utilization}", f"{a}.rollout.dtype=bfloat16",
        f"{a}.rollout.calculate_log_probs=true", f"{a}.rollout.load_format=dummy",
        f"{a}.rollout.checkpoint_engine.update_weights_bucket_megabytes={args.bucket_mb}",
        f"{a}.rollout.free_cache_engine=true", f"{a}.hybrid_engine={'false' if args.standalone else 'true'}",
        "algorithm.use_kl_in_reward=false", "trainer.backend=local", "trainer.device=cuda", "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,file]", "trainer.report=false",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={out_dir}/ckpt",
        "trainer.project_name=gpu_check", f"trainer.experiment_name=grpo_vllm{'_standalone' if args.standalone else ''}",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--standalone", action="store_true", help="vLLM server replica (hybrid_engine=false)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--response", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--bucket-mb", type=int, default=512)
    parser.add_argument("--gsm8k", default=None, help="folder with GSM8K train.jsonl/test.jsonl instead of addition")
    parser.add_argument("--out", default=None, help="write the summary JSON here")
    args = parser.parse_args(argv)
    args.steps = args.steps or (4 if args.quick else 8)
    args.batch = args.batch or (32 if args.quick else 64)
    args.n = args.n or (4 if args.quick else 5)
    args.response = args.response or (256 if args.quick else 512)

    import torch

    if not torch.cuda.is_available():
        print("benchmarks/gpu/bench_grpo_vllm.py needs a CUDA GPU (torch sees none)", file=sys.stderr)
        return 2
    from hybridflow.launch.config import load_config
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    work = Path(tempfile.mkdtemp(prefix="gpu_grpo_vllm_"))
    model_dir = build_model(work / "qwen25_05b_random")
    data_dir = work / "data"
    if args.gsm8k:
        from hybridflow.data.preprocess.gsm8k import main as gsm8k_main

        gsm8k_main(["--input", args.gsm8k, "--local-dir", str(data_dir)])
    else:
        from hybridflow.data.synthetic import write_synthetic

        write_synthetic("addition", str(data_dir), train_size=args.batch * (args.steps + 1), test_size=16, seed=0)
    cfg = load_config(overrides(model_dir, data_dir, work, args))
    start = time.perf_counter()
    metrics = train_ppo(cfg, logger=Tracking("gpu_check", "grpo_vllm", default_backend=["console", "file"],
                                             output_dir=work / "logs")).metrics
    wall = time.perf_counter() - start
    later = metrics[1:] or metrics

    def med(key):
        vals = [m[key] for m in later if key in m]
        return statistics.median(vals) if vals else float("nan")

    summary = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
        "mode": "standalone server" if args.standalone else "colocated", "steps": len(metrics),
        "batch": f"{args.batch} prompts x {args.n}, response <= {args.response}",
        "throughput_tokens_per_s_per_gpu": med("perf/throughput"), "step_s": med("timing_s/step"),
        "gen_s": med("timing_s/gen"), "update_weights_s": med("timing_s/update_weights"),
        "peak_memory_allocated_gb": max(m.get("perf/max_memory_allocated_gb", 0.0) for m in metrics),
        "peak_memory_reserved_gb": max(m.get("perf/max_memory_reserved_gb", 0.0) for m in metrics),
        "rollout_probs_diff_mean": max(m.get("training/rollout_probs_diff_mean", float("nan")) for m in metrics),
        "rollout_probs_diff_max": max(m.get("training/rollout_probs_diff_max", float("nan")) for m in metrics),
        "wall_s": wall,
    }
    print(json.dumps(summary, indent=2))
    print("| date | GPU | mode | tokens/s/GPU | step s | gen s | weight sync s | peak mem GB | probs diff mean/max |")
    print(f"| {summary['date']} | {summary['gpu']} | {summary['mode']} | {summary['throughput_tokens_per_s_per_gpu']:.0f} "
          f"| {summary['step_s']:.2f} | {summary['gen_s']:.2f} | {summary['update_weights_s']:.3f} "
          f"| {summary['peak_memory_allocated_gb']:.1f} | {summary['rollout_probs_diff_mean']:.2e} / "
          f"{summary['rollout_probs_diff_max']:.2e} |")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
