"""GPU check: GRPO on the MoE families (Qwen3-MoE, DeepSeek-V3) at a few hundred million parameters, one GPU.

NOT RUN YET on a GPU: written in a session that had none (``--smoke`` runs the same code path on CPU with
tiny shapes, which is how it was checked).  Run it on a GPU machine (``pip install -c <(echo torch==YOUR_TORCH)
-e ".[test]"``, plus ``.[vllm]`` for ``--engine vllm``) and put the printed table rows, dated, in
benchmarks/RESULTS.md (section "GPU checks").

Each model is built from its family's config (``hybridflow/utils/tiny_model.FAMILIES``) at the sizes below with
random weights in bf16, so nothing is downloaded; the tokenizer is hybridflow's small BPE.  Prompts come from the
built-in addition task; rewards are meaningless on a random model -- this measures the machinery, not learning.

Reported per family (medians over the steps after the first): ``perf/throughput`` (tokens/s/GPU), step and
generation seconds, peak GPU memory, ``training/rollout_probs_diff_{mean,max}`` (bf16 on both sides: expect
~1e-3), the expert load of the update (``actor/moe/max_vio/max``: 0 = balanced, 1 = the busiest expert takes
twice its share) and, with ``--aux``, ``actor/moe_aux_loss`` (Qwen3-MoE only: DeepSeek-V3 has no auxiliary loss).

    python benchmarks/gpu/bench_moe.py                         # both families, hf rollout, 6 steps
    python benchmarks/gpu/bench_moe.py --family qwen3-moe --engine vllm --aux
    python benchmarks/gpu/bench_moe.py --smoke                 # CPU, tiny shapes, 2 steps: the code path only

``--engine hf`` generates with the actor's own module, which the hf engine runs with sdpa or eager attention
only: on a machine with flash-attn installed (the actor then loads ``flash_attention_2``) use ``--engine vllm``.
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

# ~0.4B (Qwen3-MoE: 8 layers x 32 experts of 512) and ~0.5B (DeepSeek-V3: MLA with the released head dims and
# latent size, which vLLM's MLA kernels need; a dense first layer, then 7 MoE layers x 32 experts + 1 shared).
GPU_SHAPES = {
    "qwen3-moe": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
                      moe_intermediate_size=512),
    "deepseek-v3": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                        num_key_value_heads=16, q_lora_rank=384, kv_lora_rank=512, qk_nope_head_dim=128,
                        qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=32, num_experts_per_tok=4, n_group=4,
                        topk_group=2, n_shared_experts=1, moe_intermediate_size=512, first_k_dense_replace=1,
                        topk_method="noaux_tc", scoring_func="sigmoid"),
}


def build_model(family: str, folder: Path, smoke: bool) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridflow.utils.tiny_model import FAMILIES, build_bpe_tokenizer, make_tiny_checkpoint

    if smoke:
        return str(make_tiny_checkpoint(folder, size="nano", tokenizer="bpe", family=family, initializer_range=0.2))
    tok = build_bpe_tokenizer()
    fields = {**FAMILIES[family].overrides, **GPU_SHAPES[family], "vocab_size": len(tok),
              "max_position_embeddings": 4096, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
              "bos_token_id": None}
    cfg = AutoConfig.for_model(FAMILIES[family].model_type, **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    print(f"model: {family}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, bf16 -> {folder}")
    return str(folder)


def overrides(family: str, model_dir: str, data_dir: Path, out_dir: Path, args) -> list[str]:
    a = "actor_rollout_ref"
    device = "cpu" if args.smoke else "cuda"
    gpu_only = [] if args.smoke else [
        f"{a}.actor.fsdp_config.model_dtype=bf16", f"{a}.rollout.dtype=bfloat16",
        f"{a}.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
    ]
    vllm = [f"{a}.rollout.tensor_model_parallel_size=1", f"{a}.rollout.load_format=dummy"] \
        if args.engine == "vllm" else []
    aux = [f"+{a}.model.override_config.output_router_logits=true"] if args.aux and family == "qwen3-moe" else []
    return [
        "algorithm.adv_estimator=grpo", f"{a}.model.path={model_dir}", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", f"data.train_batch_size={args.batch}",
        "data.max_prompt_length=128", f"data.max_response_length={args.response}", "data.filter_overlong_prompts=true",
        f"{a}.model.use_remove_padding=true", f"{a}.model.enable_gradient_checkpointing=true",
        f"{a}.actor.optim.lr=1e-6", f"{a}.actor.ppo_mini_batch_size={args.batch}",
        f"{a}.actor.use_dynamic_bsz=true", f"{a}.actor.ppo_max_token_len_per_gpu={args.max_tokens}",
        f"{a}.rollout.log_prob_use_dynamic_bsz=true", f"{a}.rollout.log_prob_max_token_len_per_gpu={args.max_tokens}",
        f"{a}.rollout.name={args.engine}", f"{a}.rollout.n={args.n}", f"{a}.rollout.calculate_log_probs=true",
        *gpu_only, *vllm, *aux,
        "algorithm.use_kl_in_reward=false", "trainer.backend=local", f"trainer.device={device}", "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console,file]", "trainer.report=false",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={out_dir}/ckpt",
        "trainer.project_name=gpu_check", f"trainer.experiment_name=moe_{family}_{args.engine}",
    ]


def run_family(family: str, args, work: Path) -> dict:
    import torch

    from hybridflow.launch.config import load_config
    from hybridflow.data.synthetic import write_synthetic
    from hybridflow.tracking import Tracking
    from hybridflow.trainer.main_ppo import train_ppo

    model_dir = build_model(family, work / family, args.smoke)
    data_dir = work / f"data_{family}"
    write_synthetic("addition", str(data_dir), train_size=args.batch * (args.steps + 1), test_size=8, seed=0)
    cfg = load_config(overrides(family, model_dir, data_dir, work / f"out_{family}", args))
    start = time.perf_counter()
    metrics = train_ppo(cfg, logger=Tracking("gpu_check", f"moe_{family}", default_backend=["file"],
                                             output_dir=work / f"logs_{family}")).metrics
    wall = time.perf_counter() - start
    steps = [m for m in metrics if "actor/pg_loss" in m]
    later = steps[1:] or steps

    def med(key):
        vals = [m[key] for m in later if key in m]
        return statistics.median(vals) if vals else float("nan")

    def worst(key):
        vals = [m[key] for m in steps if key in m]
        return max(vals) if vals else float("nan")

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu (smoke)",
        "family": family, "engine": args.engine, "steps": len(steps),
        "batch": f"{args.batch} prompts x {args.n}, response <= {args.response}",
        "throughput_tokens_per_s_per_gpu": med("perf/throughput"), "step_s": med("timing_s/step"),
        "gen_s": med("timing_s/gen"),
        "peak_memory_allocated_gb": worst("perf/max_memory_allocated_gb"),
        "rollout_probs_diff_mean": worst("training/rollout_probs_diff_mean"),
        "rollout_probs_diff_max": worst("training/rollout_probs_diff_max"),
        "moe_max_vio": med("actor/moe/max_vio/max"), "moe_avg_vio": med("actor/moe/avg_vio/avg"),
        "moe_aux_loss": med("actor/moe_aux_loss"), "wall_s": wall,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=sorted(GPU_SHAPES), action="append", default=None)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--aux", action="store_true", help="train Qwen3-MoE with its router auxiliary loss")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, 2 steps: checks the code path")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--response", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=16384, help="token budget per micro-batch")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--out", default=None, help="write the summaries (JSON) here")
    args = parser.parse_args(argv)
    args.steps = args.steps or (2 if args.smoke else 6)
    args.batch = args.batch or (4 if args.smoke else 32)
    args.n = args.n or (2 if args.smoke else 4)
    args.response = args.response or (8 if args.smoke else 256)

    import torch

    if not args.smoke and not torch.cuda.is_available():
        print("benchmarks/gpu/bench_moe.py needs a CUDA GPU (torch sees none); --smoke runs the code path on CPU",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="gpu_moe_"))
    rows = [run_family(family, args, work) for family in (args.family or sorted(GPU_SHAPES))]
    print(json.dumps(rows, indent=2))
    print("| date | device | family | engine | tokens/s/GPU | step s | gen s | peak mem GB | probs diff mean/max "
          "| expert max_vio / avg_vio | aux loss |")
    for r in rows:
        print(f"| {r['date']} | {r['device']} | {r['family']} | {r['engine']} | "
              f"{r['throughput_tokens_per_s_per_gpu']:.0f} | {r['step_s']:.2f} | {r['gen_s']:.2f} | "
              f"{r['peak_memory_allocated_gb']:.1f} | {r['rollout_probs_diff_mean']:.2e} / "
              f"{r['rollout_probs_diff_max']:.2e} | {r['moe_max_vio']:.2f} / {r['moe_avg_vio']:.2f} | "
              f"{r['moe_aux_loss']:.4f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
