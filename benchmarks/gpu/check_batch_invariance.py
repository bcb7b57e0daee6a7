"""GPU check: what exact on-policy log-probs would need on a GPU, measured (issue 36 item 3).

On CPU, ``engine/batch_invariant.py`` makes a token's arithmetic independent of its batch (MKL's strict mode for
products, an attention computed with plain batched products, RMSNorm / SiLU kernels whose vector and scalar paths
agree), so the hf rollout's log-probs equal the trainer's bit for bit.  This script measures, on one CUDA GPU, which
of those properties hold there, in bf16 and fp32 (each check prints one line; all in well under 2 minutes on an
H100-class GPU; needs torch + transformers, no Ray / vLLM):

1. ``linear``: rows of ``F.linear`` (a Qwen2.5-0.5B MLP shape, 896 x 4864) computed inside M = 1..2048 rows vs inside
   M = 4096: how many row counts M give a row other bits (cuBLAS picks tiles and split-K by the shape);
2. ``bmm``: the same for a batched product (attention's ``q k^T``: 14 heads x head dim 64);
3. ``attention``: ``invariant_attention`` (the CPU kernel) for a decode step against a cache vs the full causal pass;
   and torch's sdpa (flash / memory-efficient) the same way;
4. ``rowwise``: RMSNorm, softmax and logsumexp rows over 1..2048 rows (usually invariant on GPU: one row per block);
5. ``fused_head``: the chunked fused LM head (``engine/fused_head.py``) vs materialised logits at Qwen2.5's
   151,936-token vocabulary (T tokens x hidden 896): max |difference| of log-probs, entropy and both gradients, and
   the peak CUDA memory and time of each (the check that must pass: see PASS below);
6. ``model``: a Qwen2.5-0.5B-shaped 4-layer model (random init, 151,936-token vocabulary): the log-prob of each token
   of 8 sequences when it is decoded with a KV cache one token at a time vs scored in one forward (the trainer's),
   max |difference| -- with torch's kernels, and with the model marked batch-invariant.

Prints ``BATCH-INVARIANCE {json}`` lines, then ``PASS`` or ``FAIL: <reasons>`` and exits 0 / 1.  PASS means: every
check ran without an error, and the fused head agrees with the materialised one -- fp32: log-probs and entropy within
1e-4, gradients within 1e-4 relative to their largest entry; bf16: log-probs and entropy within 0.1 of the fp32
reference and no worse than 1.5 x the materialised bf16 head's own error, gradients within 5e-2 relative -- while its
peak memory is below the materialised head's.  Checks 1-4 and 6 are measurements (they say what exact log-probs
would need on a GPU; exact mode is CPU-only and refused on CUDA at config time), not pass criteria.
Writes nothing.  Run from the repository root: ``python benchmarks/gpu/check_batch_invariance.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _report(check: str, **fields) -> None:
    print("BATCH-INVARIANCE " + json.dumps({"check": check, **fields}), flush=True)


def _row_counts(quick: bool) -> list[int]:
    counts = [1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 511, 512, 1024, 2048]
    return counts[::3] if quick else counts


def check_linear(dtype, quick: bool) -> None:
    import torch
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(0)
    for k, n in ((896, 4864), (4864, 896)):
        w = torch.randn(n, k, generator=g, device="cuda", dtype=dtype)
        x = torch.randn(4096, k, generator=g, device="cuda", dtype=dtype)
        ref = F.linear(x, w)
        bad = [m for m in _row_counts(quick) if not torch.equal(F.linear(x[:m], w), ref[:m])]
        _report("linear", dtype=str(dtype), k=k, n=n, mismatched_row_counts=bad)


def check_bmm(dtype, quick: bool) -> None:
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(14, 2048, 64, generator=g, device="cuda", dtype=dtype)
    k = torch.randn(14, 64, 2048, generator=g, device="cuda", dtype=dtype)
    ref = torch.bmm(q, k)
    bad = [m for m in _row_counts(quick) if not torch.equal(torch.bmm(q[:, :m].contiguous(), k), ref[:, :m])]
    _report("bmm", dtype=str(dtype), mismatched_row_counts=bad)


def check_attention(dtype, quick: bool) -> None:
    import torch
    import torch.nn.functional as F

    from hybridflow.engine.batch_invariant import invariant_attention

    g = torch.Generator(device="cuda").manual_seed(2)
    L = 256
    q = torch.randn(2, 14, L, 64, generator=g, device="cuda", dtype=dtype)
    k = torch.randn(2, 2, L, 64, generator=g, device="cuda", dtype=dtype)
    v = torch.randn(2, 2, L, 64, generator=g, device="cuda", dtype=dtype)
    kr, vr = k.repeat_interleave(7, 1), v.repeat_interleave(7, 1)
    full_inv = invariant_attention(q, k, v, None, 0.125)
    full_sdpa = F.scaled_dot_product_attention(q, kr, vr, is_causal=True, scale=0.125)
    steps = range(0, L, 37 if quick else 7)
    bad_inv, bad_sdpa = [], []
    for t in steps:
        cols = torch.arange(L, device="cuda")
        allowed = (cols <= t)[None, None, None, :].expand(2, 1, 1, L)
        if not torch.equal(invariant_attention(q[:, :, t:t + 1], k, v, allowed, 0.125)[:, :, 0], full_inv[:, :, t]):
            bad_inv.append(t)
        step = F.scaled_dot_product_attention(q[:, :, t:t + 1], kr[:, :, :t + 1], vr[:, :, :t + 1], scale=0.125)
        if not torch.equal(step[:, :, 0], full_sdpa[:, :, t]):
            bad_sdpa.append(t)
    _report("attention", dtype=str(dtype), positions=len(steps), invariant_kernel_mismatches=len(bad_inv),
            sdpa_mismatches=len(bad_sdpa))


def check_rowwise(dtype, quick: bool) -> None:
    import torch

    from hybridflow.engine.batch_invariant import invariant_rms_norm

    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4096, 896, generator=g, device="cuda", dtype=dtype)
    z = torch.randn(2048, 151_936 // 8, generator=g, device="cuda", dtype=torch.float32)
    w = torch.randn(896, generator=g, device="cuda", dtype=dtype)
    ops = {"rms_norm": (lambda t: invariant_rms_norm(t, w, 1e-6), x), "softmax": (lambda t: t.softmax(-1), z),
           "logsumexp": (lambda t: t.logsumexp(-1), z)}
    for name, (fn, data) in ops.items():
        ref = fn(data)
        bad = [m for m in _row_counts(quick) if m <= data.shape[0] and not torch.equal(fn(data[:m]), ref[:m])]
        _report("rowwise", op=name, dtype=str(dtype), mismatched_row_counts=bad)


def _head_run(h, w, labels, fused: bool, coef):
    """Forward + backward of ``sum(coef_lp * lp) + sum(coef_ent * ent)``: outputs, gradients, peak bytes, seconds."""
    import torch

    from hybridflow.algorithms.entropy import entropy_from_logits, logprobs_from_logits
    from hybridflow.engine.fused_head import fused_token_outputs

    h, w = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    if fused:
        out = fused_token_outputs(h, w, labels, 0.7, calculate_entropy=True)
        lp, ent = out["log_probs"], out["entropy"]
    else:
        logits = (h @ w.t()) / 0.7
        lp, ent = logprobs_from_logits(logits, labels), entropy_from_logits(logits)
    ((coef[0] * lp.float()).sum() + (coef[1] * ent.float()).sum()).backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() - base
    return lp.detach().float(), ent.detach().float(), h.grad.float(), w.grad.float(), peak, seconds


def check_fused_head(dtype, quick: bool) -> dict:
    import torch

    g = torch.Generator(device="cuda").manual_seed(4)
    tokens, hidden, vocab = (2048 if quick else 4096), 896, 151_936
    h = torch.randn(tokens, hidden, generator=g, device="cuda") * 0.5
    w = torch.randn(vocab, hidden, generator=g, device="cuda") * 0.05
    labels = torch.randint(0, vocab, (tokens,), generator=g, device="cuda")
    coef = (torch.randn(tokens, generator=g, device="cuda"), 0.01 * torch.randn(tokens, generator=g, device="cuda"))
    ref = _head_run(h, w, labels, False, coef)  # fp32 materialised: the reference
    mat = _head_run(h.to(dtype), w.to(dtype), labels, False, coef)
    _head_run(h.to(dtype), w.to(dtype), labels, True, coef)  # warm-up (kernel selection)
    fus = _head_run(h.to(dtype), w.to(dtype), labels, True, coef)

    def errors(run):
        out = [float((run[i] - ref[i]).abs().max()) for i in (0, 1)]
        return out + [float((run[i] - ref[i]).abs().max() / ref[i].abs().max()) for i in (2, 3)]

    e_fus, e_mat = errors(fus), errors(mat)
    row = {"dtype": str(dtype), "tokens": tokens, "vocab": vocab,
           "max_diff_fused": dict(zip(("log_probs", "entropy", "grad_hidden_rel", "grad_weight_rel"), e_fus)),
           "max_diff_materialised": dict(zip(("log_probs", "entropy", "grad_hidden_rel", "grad_weight_rel"), e_mat)),
           "peak_mb_fused": round(fus[4] / 2**20, 1), "peak_mb_materialised": round(mat[4] / 2**20, 1),
           "seconds_fused": round(fus[5], 4), "seconds_materialised": round(mat[5], 4)}
    row["memory_ratio"] = round(fus[4] / max(mat[4], 1), 3)
    row["time_ratio"] = round(fus[5] / max(mat[5], 1e-9), 3)
    if dtype == torch.float32:
        ok = max(e_fus[:2]) <= 1e-4 and max(e_fus[2:]) <= 1e-4
    else:
        ok = (max(e_fus[:2]) <= 0.1 and all(f <= 1.5 * m + 1e-6 for f, m in zip(e_fus[:2], e_mat[:2]))
              and max(e_fus[2:]) <= 5e-2)
    row["pass"] = bool(ok and fus[4] < mat[4])
    _report("fused_head", **row)
    return row


def _decode_vs_forward(model, ids: "torch.Tensor") -> float:
    """Max |log-prob of each next token decoded with a KV cache, one token at a time - scored in one forward|."""
    import torch
    from transformers import DynamicCache

    with torch.no_grad():
        full = model(input_ids=ids).logits.float().log_softmax(-1)
        full = full[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        cache = DynamicCache()
        out = model(input_ids=ids[:, :1], past_key_values=cache, use_cache=True)
        steps = []
        for t in range(1, ids.shape[1]):
            lp = out.logits[:, -1].float().log_softmax(-1).gather(-1, ids[:, t:t + 1]).squeeze(-1)
            steps.append(lp)
            out = model(input_ids=ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
    return float((torch.stack(steps, 1) - full).abs().max())


def check_model(dtype, quick: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from hybridflow.engine.batch_invariant import mark_batch_invariant

    config = Qwen2Config(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).cuda().eval()
    ids = torch.randint(0, 151_936, (8, 64 if quick else 160), device="cuda")
    plain = _decode_vs_forward(model, ids)
    mark_batch_invariant(model)
    marked = _decode_vs_forward(model, ids)
    _report("model", dtype=str(dtype), tokens=int(ids.numel()), max_diff_torch_kernels=plain,
            max_diff_batch_invariant_attention_norm_silu=marked)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer row counts and positions")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this is a GPU check", file=sys.stderr)
        return 2
    start = time.perf_counter()
    _report("device", name=torch.cuda.get_device_name(), torch=torch.__version__)
    failures = []
    for dtype in (torch.bfloat16, torch.float32):
        for check in (check_linear, check_bmm, check_attention, check_rowwise, check_fused_head, check_model):
            try:
                row = check(dtype, args.quick)
            except Exception as e:  # noqa: BLE001 - report every check, then judge
                _report(check.__name__, dtype=str(dtype), error=f"{type(e).__name__}: {e}")
                failures.append(f"{check.__name__} {dtype}: {type(e).__name__}: {e}")
                continue
            if isinstance(row, dict) and not row.get("pass", True):
                failures.append(f"fused head {dtype} out of tolerance or not smaller: {json.dumps(row)}")
    _report("done", seconds=round(time.perf_counter() - start, 1))
    print("PASS" if not failures else "FAIL: " + " | ".join(failures), flush=True)
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
