"""GPU check of the rollout engines alone: vLLM (and SGLang, when installed) against HF on the same weights.

NOT RUN YET: written without a GPU.  On a GPU machine, for each engine on the Qwen2.5-0.5B-architecture model
(random init, bf16; see bench_grpo_vllm.py):

* generation from token ids with per-token log-probs; the rollout/HF log-prob difference (bf16 both sides);
* a weight update (every parameter perturbed) timed, then greedy output compared with HF's greedy decode on the
  new weights (bf16 argmax ties may differ late in a sequence: the first 8 tokens are compared);
* sleep / wake_up (vLLM sleep mode, SGLang memory release/resume): GPU memory before, asleep, awake.

    python benchmarks/gpu/check_engines.py             # vLLM, then SGLang if importable
    python benchmarks/gpu/check_engines.py --engine sglang

Record the printed lines, dated, in benchmarks/RESULTS.md; once SGLang has passed here, its start-up notice
(``UNVERIFIED_NOTICE`` in hybridflow/rollout/sglang/engine.py) can go.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def gpu_gb() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**30


def check(engine_name: str, model_dir: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.rollout import SamplingParams

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    if engine_name == "vllm":
        from hybridflow.rollout.vllm.engine import VLLMRolloutEngine

        engine = VLLMRolloutEngine(model_dir, engine_args={"dtype": "bfloat16", "gpu_memory_utilization": 0.3,
                                                           "max_model_len": 1024, "enable_sleep_mode": True,
                                                           "load_format": "auto"}, device="cuda", seed=0)
    else:
        from hybridflow.rollout.sglang.engine import SGLangRolloutEngine

        engine = SGLangRolloutEngine(model_dir, server_args=["--dtype", "bfloat16", "--mem-fraction-static", "0.3",
                                                             "--context-length", "1024", "--enable-memory-saver"])
    out: dict = {"engine": engine_name}
    try:
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(10, 500, (int(n),), generator=gen).tolist() for n in torch.randint(16, 64, (16,))]
        outs = engine.generate_batch(prompts, SamplingParams(temperature=1.0, max_tokens=64, logprobs=True,
                                                             ignore_eos=True))
        diffs = []
        with torch.no_grad():
            for p, o in zip(prompts, outs):
                logits = hf(torch.tensor([p + o.token_ids], device="cuda")).logits[0, len(p) - 1 : -1].float()
                ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(o.token_ids, device="cuda")[:, None])
                diffs.append((ref.squeeze(1).cpu() - torch.tensor(o.log_probs)).abs())
        d = torch.cat(diffs)
        out["logprob_diff_mean"], out["logprob_diff_max"] = d.mean().item(), d.max().item()
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.02)
        start = time.perf_counter()
        engine.update_weights(hf.state_dict().items())
        torch.cuda.synchronize()
        out["update_weights_s"] = time.perf_counter() - start
        greedy = engine.generate_batch(prompts[:4], SamplingParams(do_sample=False, max_tokens=8, ignore_eos=True))
        same = 0
        with torch.no_grad():
            for p, o in zip(prompts[:4], greedy):
                ref = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=8, do_sample=False,
                                  eos_token_id=None)[0, len(p):].tolist()
                same += ref == o.token_ids
        out["greedy_matches_after_update"] = f"{same}/4"
        out["gpu_gb_awake"] = gpu_gb()
        engine.sleep()
        out["gpu_gb_asleep"] = gpu_gb()
        engine.wake_up()
        out["gpu_gb_woken"] = gpu_gb()
        engine.update_weights(hf.state_dict().items())  # after a level-2 sleep the weights come back from the actor
        again = engine.generate_batch(prompts[:1], SamplingParams(do_sample=False, max_tokens=8, ignore_eos=True))
        out["generates_after_wake_up"] = len(again[0].token_ids) == 8
    finally:
        engine.shutdown()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["vllm", "sglang", "all"], default="all")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/gpu/check_engines.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks.gpu.bench_grpo_vllm import build_model

    model_dir = build_model(Path(tempfile.mkdtemp(prefix="gpu_engines_")) / "model")
    engines = ["vllm", "sglang"] if args.engine == "all" else [args.engine]
    for name in engines:
        if importlib.util.find_spec(name) is None:
            print(f"{name}: not installed, skipped")
            continue
        print(time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch.cuda.get_device_name(0), check(name, model_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
