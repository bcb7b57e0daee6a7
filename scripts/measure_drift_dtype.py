#!/usr/bin/env python3
"""Healthy drift of the hf engine vs a full forward of the same weights, per dtype (issue 34 measurement).

A tiny Qwen2 (random, lm_head scaled so next-token distributions are peaked like a trained LM's: the measured mean
probability of the sampled token is printed), generates with the hf rollout engine; the same weights recompute
each sampled token's log-prob in one full forward (what the trainer does). Prints the mean / max |p_r - p_t|."""
import json, sys, time, tempfile
import torch
from hybridflow.utils.tiny_model import make_tiny_checkpoint
from hybridflow.rollout import SamplingParams, create_rollout_engine
from transformers import AutoModelForCausalLM

device = "cuda" if torch.cuda.is_available() else "cpu"
size = sys.argv[1] if len(sys.argv) > 1 else "tiny"
rows, length = int(sys.argv[2]) if len(sys.argv) > 2 else 32, 48
d = make_tiny_checkpoint(tempfile.mkdtemp(), size=size)
out = {}
for dtype_name in ("float32", "bfloat16"):
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(float(sys.argv[3]) if len(sys.argv) > 3 else 12.0)
    model = model.to(device=device, dtype=dtype).eval()
    engine = create_rollout_engine("hf", model=model, max_num_seqs=rows)
    params = SamplingParams(temperature=1.0, max_tokens=length, ignore_eos=True, logprobs=True, seed=None)
    prompts = [[3 + (i % 20), 4 + (i % 7), 5, 6 + (i % 11)] for i in range(rows)]
    t = time.time()
    outs = engine.generate_batch(prompts, params)
    gaps, probs = [], []
    with torch.no_grad():
        for p, o in zip(prompts, outs):
            ids = torch.tensor([p + list(o.token_ids)], device=device)
            logits = model(ids).logits.float()[0, len(p) - 1:-1]
            lp = logits.log_softmax(-1).gather(1, ids[0, len(p):, None]).squeeze(1)
            r = torch.tensor(o.log_probs, device=device)
            gaps.append((r.exp() - lp.exp()).abs())
            probs.append(lp.exp())
    g, pr = torch.cat(gaps), torch.cat(probs)
    out[dtype_name] = {"mean_gap": float(g.mean()), "max_gap": float(g.max()), "mean_p": float(pr.mean()),
                       "tokens": int(g.numel()), "seconds": round(time.time() - t, 1)}
    print(dtype_name, json.dumps(out[dtype_name]), flush=True)
print(json.dumps({"device": device, "size": size, **out}))
