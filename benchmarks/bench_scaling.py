"""GRPO step time and peak memory as batch size, response length and model size grow, each point beside its
matmul-bound time; RSS soak (spec S15, issue 16 item 6).

Each point is a fresh process running the full hybridflow GRPO step (local backend: rollout, reward,
advantages, actor update) on the random-init char model, so completions run to (nearly) the full response
length and the work per step is what the table says. With the on-policy default (one optimiser step per
batch, ``StepPlan.old_log_prob_in_update``) there is no separate old-log-prob forward pass: pi_old comes
from the update's own forward. Sweeps: prompts per step and response length on ``tiny`` (0.3M parameters;
one ``medium`` point on the batch axis), model size over ``tiny`` / ``medium`` (18M) / ``base100m`` (104M)
on a small job (2 prompts x 2 samples x 32 tokens) so the 100M point finishes. Every row names its job.

Reported per point: median step time after warm-up, peak RSS of the process, per-token cost (step time /
(prompt+response tokens), so linear scaling reads as a flat column), and the **hardware bound** beside it:

* FLOPs of the step's work, from the tokens the step actually processed (``prompt_length`` /
  ``response_length`` metrics) and ``count_dense_params`` (matmul parameters N, embedding and LM head
  included, as ``hybridflow.tracking.flops``):
  generation = one forward over prompt+response tokens, 2·N·tokens (KV cache: each token once), of which
  the prompt tokens are the batched prefill and the response tokens the decode steps;
  update = forward + backward over the same tokens, 6·N·tokens;
  attention products added as in ``flops.py`` (2·s²·layers·heads·head_dim per sequence forward, x3 for
  forward+backward; causal masking not discounted), counted at the batched rate.
* The rate: a **direct timing of fp32 matmuls of the model's own shapes** ``(rows x hidden) @ (hidden x
  intermediate)``, best of 5, measured in the child process right after its run, so with the thread count
  the run used (``OMP_NUM_THREADS=1`` per child here; ``--smoke`` runs in-process with the caller's threads).
  Two row counts: the step's prompt+response tokens (the update's and prefill's matmuls) and the number of
  sequences (a decode step's matmuls: few rows, lower rate). The weights of one such matmul stay in cache
  while timed, so the rate is an upper bound on what the real model (weights streamed from memory) gets.
* bound s = prefill FLOPs / batched rate + decode FLOPs / decode rate + update FLOPs / batched rate: the
  step cannot be faster than its matmuls at the measured rate. ``step / bound`` is how far above that the
  step is (Python, sampling, optimiser, memory traffic, small-shape kernels...). Per stage, ``gen`` is
  ``timing_s/gen`` vs the generation bound and ``update`` ``timing_s/update_actor`` vs the update bound.

The soak runs many steps of one configuration and fits a least-squares line to the RSS after every step
(``perf/cpu_memory_used_gb``) over the second half of the run (after allocator warm-up): a leak shows as
a positive slope in MiB/step.

Run: ``.venv/bin/python benchmarks/bench_scaling.py [--quick] [--smoke] [--steps 200] [--skip-soak]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()


def model_dims(model_dir: str) -> dict:
    """Matmul parameters and attention sizes of the checkpoint (``count_dense_params`` of its config.json)."""
    from hybridflow.tracking.flops import count_dense_params

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    n, dims = count_dense_params(cfg)
    return {"n_params": n, "hidden": cfg["hidden_size"], "inter": cfg["intermediate_size"], **dims}


def matmul_rate(rows: int, hidden: int, inter: int, repeats: int = 5, min_s: float = 0.02) -> float:
    """Best-of-``repeats`` fp32 ``(rows x hidden) @ (hidden x inter)`` rate (FLOP/s), current thread count."""
    import torch

    a, b = torch.randn(max(rows, 1), hidden), torch.randn(hidden, inter)
    flops = 2.0 * a.shape[0] * hidden * inter
    torch.mm(a, b)  # warm-up
    start = time.perf_counter()
    torch.mm(a, b)
    inner = max(1, int(min_s / max(time.perf_counter() - start, 1e-7)))  # each repeat lasts ~min_s
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b)
        best = min(best, (time.perf_counter() - start) / inner)
    return flops / best


def child(job: C.GRPOJob) -> dict:
    import torch

    logger = C.run_hybridflow(job.overrides() + ["trainer.logger=[]"])
    steps = [m for _, _, m in logger.records if "timing_s/step" in m]
    n_seq = job.prompts * job.group
    res = {"step_times": [m["timing_s/step"] for m in steps], "tokens": [m["perf/total_num_tokens"] for m in steps],
           "gen_times": [m.get("timing_s/gen", 0.0) for m in steps],
           "update_times": [m.get("timing_s/update_actor", 0.0) for m in steps],
           "old_log_prob_stage": any("timing_s/old_log_prob" in m for m in steps),
           "prompt_tokens": [m["prompt_length/mean"] * n_seq for m in steps],
           "response_tokens": [m["response_length/mean"] * n_seq for m in steps],
           "rss_mb": [m["perf/cpu_memory_used_gb"] * 1024 for m in steps], "peak_rss_mb": C.peak_rss_mb()}
    # The matmul rate, after the run (peak RSS already read), with the thread count the run used.
    d = model_dims(job.model)
    rows = int(round(C.median(res["tokens"]))) if steps else n_seq
    res.update(dims=d, threads=torch.get_num_threads(), rate_batch=matmul_rate(rows, d["hidden"], d["inter"]),
               rate_decode=matmul_rate(n_seq, d["hidden"], d["inter"]))
    return res


def step_bounds(res: dict, n_seq: int) -> list[tuple[float, float]]:
    """(generation bound s, update bound s) of every recorded step (module docstring)."""
    d = res["dims"]
    n, attn_dim = d["n_params"], d["layers"] * d["heads"] * d["head_dim"]
    out = []
    for p, r in zip(res["prompt_tokens"], res["response_tokens"]):
        seq = (p + r) / n_seq
        attn_fwd = 2.0 * n_seq * seq * seq * attn_dim
        gen = (2.0 * n * p + attn_fwd) / res["rate_batch"] + 2.0 * n * r / res["rate_decode"]
        update = (6.0 * n * (p + r) + 3 * attn_fwd) / res["rate_batch"]
        out.append((gen, update))
    return out


IN_PROCESS = False  # --smoke: run points in this process (no interpreter start-up per point; RSS is shared)


def point(job: C.GRPOJob, warmup: int) -> dict:
    res = child(job) if IN_PROCESS else C.run_child(SCRIPT, ["--child", json.dumps(asdict(job))], timeout=3600)
    if res["old_log_prob_stage"]:  # the bound below has no old-log-prob forward: say so rather than mislead
        print("note: this job ran a separate old_log_prob forward; the bound leaves it out", flush=True)
    n_seq = job.prompts * job.group
    times, toks = res["step_times"][warmup:], res["tokens"][warmup:]
    bounds = step_bounds(res, n_seq)[warmup:]
    gen_b, upd_b = C.median([g for g, _ in bounds]), C.median([u for _, u in bounds])
    bound = C.median([g + u for g, u in bounds])
    step, gen, upd = C.median(times), C.median(res["gen_times"][warmup:]), C.median(res["update_times"][warmup:])
    return {"step_s": step, "bound_s": bound, "gen_s": gen, "gen_bound_s": gen_b, "update_s": upd,
            "update_bound_s": upd_b, "ms_per_token": 1000 * C.median([t / n for t, n in zip(times, toks)]),
            "peak_rss_mb": res["peak_rss_mb"], "rss_mb": res["rss_mb"], "params_m": res["dims"]["n_params"] / 1e6,
            "rates": (res["rate_batch"], res["rate_decode"]), "threads": res["threads"]}


HEADERS = ["model", "job (prompts x samples x tokens)", "params M", "median step s", "bound s", "step / bound",
           "gen s", "gen / bound", "update s", "update / bound", "ms / token", "peak RSS MiB",
           "matmul GFLOP/s batch / decode (threads)", "load (1 min)"]


def axis(name: str, points: list) -> None:
    """``points``: (axis value, job, warm-up steps); one table row per point, printed when the axis is done."""
    rows = []
    for v, job, warmup in points:
        r = point(job, warmup)
        rb, rd = r["rates"]
        rows.append([v, Path(job.model).name.rsplit("_s", 1)[0], f"{job.prompts} x {job.group} x {job.response_length}",
                     r["params_m"], r["step_s"], r["bound_s"], r["step_s"] / r["bound_s"], r["gen_s"],
                     r["gen_s"] / r["gen_bound_s"], r["update_s"], r["update_s"] / r["update_bound_s"],
                     r["ms_per_token"], r["peak_rss_mb"], f"{rb / 1e9:.3g} / {rd / 1e9:.3g} ({r['threads']})",
                     C.machine_state()["load"].split()[0]])
    print(f"\n{name}")
    C.print_table([name, *HEADERS], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="one point per axis, few steps (CI smoke test)")
    p.add_argument("--steps", type=int, default=None, help="soak steps (default 200; 40 with --quick)")
    p.add_argument("--skip-soak", action="store_true", help="scaling tables only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        C.emit_result(child(C.job_from_json(args.child)))
        return 0

    global IN_PROCESS
    IN_PROCESS = args.smoke
    work = C.DEFAULT_WORKDIR
    state = C.print_state("GRPO step scaling vs matmul bound (hybridflow, local backend)")
    data = str(C.task_data(work))
    # batches / lengths: on the base model (`small`); medium_batch: the medium point(s) of the batch axis;
    # steps per point with `warmup` dropped; the model-size axis runs `size_steps` per point with one
    # warm-up step (`big_steps` for the ~100M model, whose steps are long).
    sizes = ["tiny", "medium", "base100m"]
    if args.smoke:
        small, batches, lengths, medium_batch, sizes = "nano", [2], [8], [], ["nano"]
        steps, warmup, size_steps, big_steps, soak = 3, 1, 3, 3, args.steps or 6
    elif args.quick:
        small, batches, lengths, medium_batch = "tiny", [4, 8, 16], [8, 32, 64], [4]
        steps, warmup, size_steps, big_steps, soak = 6, 2, 5, 3, args.steps or 40
    else:
        small, batches, lengths, medium_batch = "tiny", [4, 8, 16, 32], [8, 32, 64, 128], [4, 16]
        steps, warmup, size_steps, big_steps, soak = 8, 2, 8, 5, args.steps or 200
    base = C.GRPOJob(model=C.base_model(work, small), data_dir=data, prompts=4, group=4,
                     response_length=32 if not args.smoke else 8, steps=steps)
    # The model-size job: small enough that the ~100M model finishes (one warm-up step there).
    size_job = replace(base, prompts=2, group=2, response_length=32 if not args.smoke else 8)
    print(f"base job: {base.prompts} prompts x {base.group} samples x {base.response_length} tokens, model "
          f"{small}, {steps} steps ({warmup} warm-up); model-size job {size_job.prompts} x {size_job.group} x "
          f"{size_job.response_length}, {size_steps} steps ({big_steps} for base100m), 1 warm-up; "
          f"load {state['load']}", flush=True)
    medium = C.base_model(work, "medium") if medium_batch else None
    axis("prompts per step", [(v, replace(base, prompts=v), warmup) for v in batches]
         + [(v, replace(base, prompts=v, model=medium), warmup) for v in medium_batch])
    axis("response length", [(v, replace(base, response_length=v), warmup) for v in lengths])
    axis("model size", [(v, replace(size_job, model=C.base_model(work, v),
                                     steps=big_steps if v == "base100m" else size_steps), 1) for v in sizes])

    if args.skip_soak:
        return 0
    soak_job = replace(base, steps=soak)
    r = point(soak_job, warmup)
    rss = r["rss_mb"]
    tail = rss[len(rss) // 2:]
    s = C.slope(tail)
    print(f"\nsoak: {soak} steps; RSS first {rss[0]:.1f} MiB, middle {rss[len(rss) // 2]:.1f} MiB, "
          f"last {rss[-1]:.1f} MiB, peak {r['peak_rss_mb']:.1f} MiB")
    print(f"rss_slope_mib_per_step={s:.4f}  (least squares over steps {len(rss) - len(tail) + 1}..{len(rss)}; "
          f"x1000 steps = {1000 * s:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
