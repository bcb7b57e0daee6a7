"""Child process of test_exact_log_probs: the hf engine generates (batched prefill, cached decode, continuous
batching), then the trainer's per-token forward scores the same tokens in each of its layouts; prints one JSON line
``{variant: max |rollout log-prob - trainer log-prob|}``.  A process of its own: MKL's strict mode is read at the
process's first matrix product (the environment sets it, or not)."""

import json
import sys

import torch

from hybridflow.engine.batch_invariant import strict_matmul
from hybridflow.engine.forward import response_token_outputs
from hybridflow.engine.fused_head import configure_fused_head
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.hf.engine import HFRolloutEngine

_, _, _, _, model_dir, exact, fast = sys.argv[:7]
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
texts = ["1+2=", "what is 17*3?", "hello there, how are you", "x", "99-98="]
prompts = [tok.encode(t) for t in texts for _ in range(2)]  # 2 samples per prompt, as GRPO
engine = HFRolloutEngine(model, tok, seed=5, exact_log_probs=exact == "1", fast_decode=fast == "1",
                         max_num_seqs=6)  # fewer rows than requests: rows leave and join (continuous batching)
outs = engine.generate_batch(prompts, SamplingParams(temperature=0.7, max_tokens=16, logprobs=True))


def batch(rows, outs):
    """verl's layout: prompts left-padded, responses right-padded."""
    wp, wr = max(len(p) for p in rows), max(len(o.token_ids) for o in outs)
    ids = torch.full((len(outs), wp + wr), tok.pad_token_id)
    att = torch.zeros_like(ids)
    for i, (p, o) in enumerate(zip(rows, outs)):
        ids[i, wp - len(p):wp], ids[i, wp:wp + len(o.token_ids)] = torch.tensor(p), torch.tensor(o.token_ids)
        att[i, wp - len(p):wp + len(o.token_ids)] = 1
    return {"input_ids": ids, "attention_mask": att, "position_ids": (att.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, wp:]}


def max_diff(rows, outs, packed):
    with torch.no_grad():
        lp = response_token_outputs(model, batch(rows, outs), 0.7, packed=packed)["log_probs"]
    return max((lp[i, :len(o.log_probs)] - torch.tensor(o.log_probs)).abs().max().item() for i, o in enumerate(outs))


result = {"strict": strict_matmul(), "lengths": sorted({len(o.token_ids) for o in outs})}
for fused in (False, True):
    configure_fused_head(model, fused, chunk_rows=5)
    for packed in (True, False):
        result[f"fused={fused},packed={packed}"] = max_diff(prompts, outs, packed)
    # the same rows in another order with other neighbours
    order = list(reversed(range(len(outs))))[::2]
    result[f"fused={fused},subset"] = max_diff([prompts[i] for i in order], [outs[i] for i in order], True)
print(json.dumps(result), flush=True)
