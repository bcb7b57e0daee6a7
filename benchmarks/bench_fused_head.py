"""The fused LM head (``engine/fused_head.py``) vs materialised logits at Qwen2.5's vocabulary (151,936 tokens).

Two measurements, each variant in a fresh child process (peak memory is the process's high-water mark, so one
measurement per process), variants interleaved round by round:

* ``head``  -- the head alone: hidden states (T x H) and the head's weight (V x H), forward + backward of
  ``sum(log_probs) + 0.01 sum(entropy)`` (what the PPO loss differentiates), materialised (``h W^T``, then the
  chunked log-softmax of ``algorithms/entropy.py``, autograd through the logits) vs fused;
* ``model`` -- one actor micro-batch through the real path (``engine.forward.response_token_outputs``): a Qwen2 of the
  ``medium`` shape (512 hidden, 6 layers) with a 151,936-token vocabulary, 8 rows of 32 prompt + 128 response tokens
  (the issue's shape: 8 prompts x 4, 128-token responses, one micro-batch of 8), log-probs + entropy, backward.

Reported: extra peak RSS over the process after set-up (MB), seconds per forward+backward (best of the timed
repeats), and the largest difference of the outputs and gradients between the two (in the parent: one small
case computed both ways). Run: ``.venv/bin/python benchmarks/bench_fused_head.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

VOCAB = 151_936


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _head_case(tokens: int, hidden: int, fused: bool):
    import torch

    from hybridflow.algorithms.entropy import entropy_from_logits_with_chunking, logprobs_from_logits
    from hybridflow.engine.fused_head import fused_token_outputs

    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, hidden, generator=g).requires_grad_()
    w = (torch.randn(VOCAB, hidden, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, VOCAB, (tokens,), generator=g)

    def step():
        h.grad = w.grad = None
        if fused:
            out = fused_token_outputs(h, w, y, 1.0, calculate_entropy=True)
            lp, ent = out["log_probs"], out["entropy"]
        else:
            logits = h @ w.t()
            lp, ent = logprobs_from_logits(logits, y), entropy_from_logits_with_chunking(logits)
        (lp.sum() + 0.01 * ent.sum()).backward()

    return step


def _model_case(fused: bool, workdir: Path):
    import torch

    from hybridflow.engine.forward import response_token_outputs
    from hybridflow.engine.fused_head import configure_fused_head
    from hybridflow.utils.tiny_model import build_bpe_tokenizer, build_tiny_model

    tok = build_bpe_tokenizer(vocab_size=300)
    model = build_tiny_model(tok, size="medium", seed=0, vocab_size=VOCAB)
    configure_fused_head(model, fused)
    g = torch.Generator().manual_seed(1)
    rows, prompt, response = 8, 32, 128
    ids = torch.randint(0, VOCAB, (rows, prompt + response), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "position_ids": torch.arange(prompt + response).expand(rows, -1), "responses": ids[:, prompt:]}

    def step():
        model.zero_grad(set_to_none=True)
        out = response_token_outputs(model, batch, 1.0, calculate_entropy=True, use_remove_padding=True)
        (out["log_probs"].sum() + 0.01 * out["entropy"].sum()).backward()

    return step


def child(spec: dict) -> dict:
    import torch

    torch.manual_seed(0)
    if spec["case"] == "head":
        step = _head_case(spec["tokens"], spec["hidden"], spec["fused"])
    else:
        step = _model_case(spec["fused"], Path(spec["workdir"]))
    base = _rss_mb()
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    peak = _rss_mb()
    times = [first]
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"extra_peak_mb": round(peak - base, 1), "seconds": round(min(times), 3)}


def _run_child(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=C.single_thread_env(2),
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"child {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement() -> dict:
    """Largest |fused - materialised| of log-probs, entropy and both gradients on one small case (V = 151,936)."""
    import torch

    from hybridflow.algorithms.entropy import entropy_from_logits, logprobs_from_logits
    from hybridflow.engine.fused_head import fused_token_outputs

    g = torch.Generator().manual_seed(2)
    h = torch.randn(64, 128, generator=g).requires_grad_()
    w = (torch.randn(VOCAB, 128, generator=g) * 0.05).requires_grad_()
    y = torch.randint(0, VOCAB, (64,), generator=g)
    out = fused_token_outputs(h, w, y, 0.7, calculate_entropy=True, chunk_rows=16)
    (out["log_probs"].sum() + out["entropy"].sum()).backward()
    fused = out["log_probs"].detach(), out["entropy"].detach(), h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    logits = (h @ w.t()) / 0.7
    lp, ent = logprobs_from_logits(logits, y), entropy_from_logits(logits)
    (lp.sum() + ent.sum()).backward()
    ref = lp.detach(), ent.detach(), h.grad, w.grad
    names = ("log_probs", "entropy", "grad_hidden", "grad_weight")
    return {n: float((a - b).abs().max()) for n, a, b in zip(names, fused, ref)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child")
    p.add_argument("--quick", action="store_true", help="one round, 1 timed repeat")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    C.print_state("fused LM head vs materialised logits, V = 151,936")
    rounds, repeats = (1, 1) if args.quick else (args.rounds, 2)
    cases = [("head", {"tokens": 512, "hidden": 512}), ("head", {"tokens": 2048, "hidden": 512}),
             ("head", {"tokens": 2048, "hidden": 896}), ("model", {})]
    results: dict[tuple[str, bool], list[dict]] = {}
    for _ in range(rounds):
        for case, extra in cases:
            for fused in (False, True):
                spec = {"case": case, "fused": fused, "repeats": repeats, "workdir": str(C.DEFAULT_WORKDIR), **extra}
                key = (f"{case} T={extra.get('tokens', 8 * 160)} H={extra.get('hidden', 512)}", fused)
                results.setdefault(key, []).append(_run_child(spec))
    rows = []
    for (name, fused), runs in results.items():
        if fused:
            continue
        plain, fz = runs, results[(name, True)]
        pm, fm = min(r["extra_peak_mb"] for r in plain), min(r["extra_peak_mb"] for r in fz)
        ps, fs = min(r["seconds"] for r in plain), min(r["seconds"] for r in fz)
        rows.append([name, f"{pm:.0f}", f"{fm:.0f}", f"{fm / pm:.2f}" if pm > 0 else "-", f"{ps:.2f}", f"{fs:.2f}",
                     f"{fs / ps:.2f}"])
    C.print_table(["case", "materialised MB", "fused MB", "mem ratio", "materialised s", "fused s", "time ratio"],
                  rows)
    print("max |fused - materialised| (64 tokens, T = 0.7):", agreement(), flush=True)


if __name__ == "__main__":
    main()
